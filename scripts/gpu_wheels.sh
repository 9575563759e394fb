#!/usr/bin/env bash
# The wheels scripts/gpu_check.sh needs on the GPU machine, downloaded here (where the package index is reachable)
# for the GPU machine's Python, versions as uv.lock pins them for the default environment (the automodel extra).
#
#   scripts/gpu_wheels.sh [--python X.Y | --facts FACTS_JSON] [--dest DIR] [--also PROJECT]... [--dry-run]
#
# Which Python: --python X.Y, or the "python" a GPU run measured (FACTS_JSON: the facts.json scripts/gpu_check.sh
# writes on its first step, tests/scripts/gpu_facts.py), or 3.12 (CPython 3.12.3, measured on the lent H200,
# 2026-11). Both given and different: refused (exit 2). Which projects: those FACTS_JSON says are missing, or
# nemo-automodel and megatron-fsdp (what the lent H200 lacked, 2026-11: its image holds torch, pytest, pyyaml and
# packaging; nemo-automodel's distributed package imports megatron_fsdp), plus each --also (omegaconf, hydra-core
# and antlr4-python3-runtime for a `preflight --config` run). A project uv.lock does not pin is refused (exit 2).
#
# DIR (default .whl, the device tool's convention; add /.whl/ to .git/info/exclude and name .whl in the run's carry)
# is emptied of wheels first, so that it holds exactly these (two versions of one project stop an install). After
# the download every wheel's tags are checked against the target (tests/scripts/wheel_tags.py): a wheel that does
# not fit is refused (exit 1). --dry-run prints the versions and the pip command, and downloads nothing.
# Needs uv (its lock and its pip); no network with --dry-run.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
read -r -a UV <<< "${NEMO_RL_SHIM_UV:-uv}"
DEFAULT_PYTHON=3.12
DEFAULT_PROJECTS=(nemo-automodel megatron-fsdp)

python_arg="" facts="" dest="$repo/.whl" dry_run=0 also=()
while [[ $# -gt 0 ]]; do
    case "$1" in
        --python) python_arg="${2:?--python needs X.Y}"; shift 2 ;;
        --facts) facts="${2:?--facts needs a path}"; shift 2 ;;
        --dest) dest="${2:?--dest needs a folder}"; shift 2 ;;
        --also) also+=("${2:?--also needs a project}"); shift 2 ;;
        --dry-run) dry_run=1; shift ;;
        -h|--help) sed -n '2,18p' "$0"; exit 0 ;;
        *) echo "gpu_wheels: unknown argument '$1' (see --help)" >&2; exit 2 ;;
    esac
done
cd "$repo"
py() { "${UV[@]}" run --frozen --no-sync python "$@"; }

measured="" projects=()
if [[ -n "$facts" ]]; then
    [[ -f "$facts" ]] || { echo "gpu_wheels: no facts file $facts" >&2; exit 2; }
    read -r measured missing < <(py -c '
import json, sys
f = json.load(open(sys.argv[1]))
version = ".".join(str(f.get("python", "")).split(".")[:2])
print(version or "-", ",".join(f.get("missing") or []) or "-")' "$facts")
    [[ "$measured" != "-" ]] || { echo "gpu_wheels: $facts holds no python version" >&2; exit 2; }
    [[ "$missing" == "-" ]] || IFS=, read -r -a projects <<< "$missing"
fi
if [[ -n "$python_arg" && -n "$measured" && "$python_arg" != "$measured" ]]; then
    echo "gpu_wheels: refused: --python $python_arg, but $facts measured CPython $measured on the GPU machine" >&2
    exit 2
fi
target="${python_arg:-${measured:-$DEFAULT_PYTHON}}"
[[ "$target" =~ ^3\.[0-9]+$ ]] || { echo "gpu_wheels: --python must be 3.N, got '$target'" >&2; exit 2; }
[[ -n "$facts" ]] || projects=("${DEFAULT_PROJECTS[@]}")
projects+=("${also[@]}")
if [[ ${#projects[@]} -eq 0 ]]; then
    echo "gpu_wheels: $facts says nothing the run needs is missing: no wheels to bring"
    exit 0
fi

# The default environment's pins (uv export of the automodel extra), one NAME==VERSION per project asked for.
pins=()
export_text="$("${UV[@]}" export --frozen --extra automodel --no-hashes --no-dev --no-emit-project --no-header)"
for project in "${projects[@]}"; do
    pin="$(grep -i -m1 -E "^${project}==" <<< "$export_text" | cut -d' ' -f1 || true)"
    [[ -n "$pin" ]] || { echo "gpu_wheels: uv.lock pins no $project in the default environment" >&2; exit 2; }
    pins+=("$pin")
done
pip_args=(--quiet --no-deps --only-binary=:all: --python-version "$target" --implementation cp)
for platform in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64 \
                manylinux1_x86_64 linux_x86_64; do
    pip_args+=(--platform "$platform")
done
if [[ -n "$python_arg" ]]; then
    source_words="--python"
elif [[ -n "$measured" ]]; then
    source_words="measured on the GPU machine, $facts"
else
    source_words="the default: CPython 3.12.3 measured on the lent H200, 2026-11"
fi
echo "gpu_wheels: CPython $target ($source_words): ${pins[*]}"
if [[ "$dry_run" == 1 ]]; then
    echo "gpu_wheels: dry run: python -m pip download ${pip_args[*]} -d $dest ${pins[*]}"
    exit 0
fi
mkdir -p "$dest"
rm -f "$dest"/*.whl
py -m pip download "${pip_args[@]}" -d "$dest" "${pins[@]}"
py -m tests.scripts.wheel_tags "$dest" --python "$target"
echo "gpu_wheels: $(ls "$dest"/*.whl | wc -l) wheels, $(du -sh "$dest" | cut -f1) in $dest"
