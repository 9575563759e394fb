#!/usr/bin/env bash
# One prepared GPU run: every step bounded, every step run even where an earlier one failed, a table at the end, and
# everything to keep under OUT_DIR, laid out to come back through the device tool (at most 8 files of 16 MiB, no
# deeper than 2 folders: the harvested dumps travel as one tarball).
#
#   scripts/gpu_check.sh OUT_DIR [WHEEL_DIR]                  # on the GPU machine (WHEEL_DIR default: .whl)
#   scripts/gpu_check.sh --rehearse OUT_DIR [WHEEL_DIR]       # anywhere: the CPU rehearsal (Gloo for NCCL), CI runs it
#
# Steps, in order (bounds in seconds; each also within what is left of the budget, GPU_CHECK_BUDGET_S, default 450,
# so that the whole run ends within 8 minutes on one H200 and a rerun fits in the 15 minutes a task is lent):
#   facts            60  python -m tests.scripts.gpu_facts: this Python, torch, CUDA, NCCL, what is missing (facts.json)
#   wheels          120  the wheels' tags and Requires-Python against this interpreter (one line), then installed with
#                        --no-deps into a temporary folder put first on PYTHONPATH (nothing goes into the machine's
#                        Python). Bring them with scripts/gpu_wheels.sh (it reads facts.json's Python)
#   status           60  nemo-rl-shim status
#   pytest -m gpu   180  tests/test_gpu.py: real NCCL + Gloo, FSDP2 CPU offload (two-GPU tests skip on one GPU)
#   harvest         200  python -m tests.scripts.gpu_harvest: real NCCL dumps beside their truth.json, one rank per
#                        scenario, each ending at its dump (harvest.tar.gz: <torch version>/<scenario>/)
#   hang-report on the harvest  60  python -m tests.scripts.real_nccl_check: each dump's first line against its truth
#   preflight       150  nemo-rl-shim preflight: with one GPU, 2 CPU ranks and 1 rank on the GPU; with 2+, one a GPU
#   default-timeout 120  python -m tests.scripts.gpu_default_timeout: the NeMo RL pull request's GPU tests without NeMo
#                        RL. With 2+ GPUs the two-GPU CPU-offload body on 2 ranks (cuda:nccl,cpu:gloo, every mesh axis
#                        at 45 min on both halves, CPU and CUDA all-reduces, full_tensor() of a CPU-offloaded param
#                        sharded on dp); with one GPU the one-rank path NeMo RL accepts (nccl, CPU offload off). Its
#                        first line says which ran
#   two-rank steps  150  each; with 2+ GPUs only: tests.scripts.gpu_mesh_timeouts, tests.scripts.gpu_flight_recorder
#                        --nproc 2 (with the shim and --torch-only); with fewer, the table says which did not run
#
# OUT_DIR afterwards: table.txt (step, result, seconds; also printed), steps.tsv (the same, tab-separated),
# facts.json, gpu_check.log (every step's output, its last 15 MiB), harvest.tar.gz. Unpack the harvest of a GPU run
# into the repository with `tar -xzf harvest.tar.gz -C tests/fixtures/real_nccl` (docs/testing.md).
#
# --rehearse: on a machine without a GPU, every step's logic: wheels checked but not installed (the environment has
# the packages), the harvest on Gloo (--rehearse), preflight with NEMO_RL_SHIM_PREFLIGHT_ONE_GPU_REHEARSAL=1 (one GPU
# taken as present, its rank a one-rank Gloo world), the default-timeout check with --cpu; pytest -m gpu skips.
# Environment: PYTHON (default python3; the rehearsal's test passes its own), GPU_CHECK_BUDGET_S,
# GPU_CHECK_HARVEST_ARGS (extra arguments to the harvest, e.g. "--only held_after_batch --timeout-s 2").
# Exit 0 when no step failed or ran past its bound, 1 otherwise, 2 on bad arguments.
set -uo pipefail  # not -e: every step runs

rehearse=0
if [[ "${1:-}" == "--rehearse" ]]; then rehearse=1; shift; fi
if [[ $# -lt 1 || $# -gt 2 ]]; then
    echo "usage: scripts/gpu_check.sh [--rehearse] OUT_DIR [WHEEL_DIR]" >&2
    exit 2
fi
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
mkdir -p "$1" || exit 2
out="$(cd "$1" && pwd)"
wheels="${2:-$repo/.whl}"
python="${PYTHON:-python3}"
budget="${GPU_CHECK_BUDGET_S:-450}"
read -r -a harvest_args <<< "${GPU_CHECK_HARVEST_ARGS:-}"

# The NeMo RL pull request's GPU tests, without NeMo RL (tests/scripts/gpu_default_timeout.py chooses the two-GPU
# body or the one-rank path by the GPUs it finds, and says which); the rehearsal appends --cpu (the two-GPU body on two
# CPU ranks, Gloo standing in for NCCL).
DEFAULT_TIMEOUT_CMD=("$python" -m tests.scripts.gpu_default_timeout)

MIN_STEP_S=10  # a step that would get less than this is not started: the table says the budget was spent
LOG_KEEP_BYTES=$((15 * 1024 * 1024))
scratch="$(mktemp -d -t nemo-rl-shim-gpu-check.XXXXXX)"
trap 'rm -rf "$scratch"' EXIT
cd "$repo" || exit 2
export PYTHONPATH="$repo${PYTHONPATH:+:$PYTHONPATH}"
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}" PYTHONUNBUFFERED=1
log="$out/gpu_check.log"
steps="$out/steps.tsv"
rm -f "$out/table.txt" "$out/harvest.tar.gz" "$out/facts.json"
: > "$log"
printf 'step\tresult\tseconds\n' > "$steps"
started=$SECONDS
failed=0

say() { echo "$*" | tee -a "$log"; }
record() { printf '%s\t%s\t%s\n' "$1" "$2" "$3" >> "$steps"; }
skip_step() { say "== $1: skipped ($2)"; record "$1" "skipped ($2)" 0; }

# run_step NAME BOUND_S COMMAND...: COMMAND bounded by BOUND_S or the budget left, whichever is less (GNU timeout
# signals COMMAND's whole process group, spawned ranks included); its output to the terminal and the log.
run_step() {
    local name="$1" bound="$2" left rc t0 result
    shift 2
    left=$((budget - (SECONDS - started)))
    if ((left < MIN_STEP_S)); then
        say "== $name: not run, the ${budget} s budget is spent"
        record "$name" "not run (the ${budget} s budget was spent)" 0
        failed=1
        return
    fi
    ((bound > left)) && bound=$left
    say "== $name (bound ${bound} s): $*"
    t0=$SECONDS
    timeout --kill-after=10 "$bound" "$@" 2>&1 | tee -a "$log"
    rc=${PIPESTATUS[0]}
    case "$rc" in
        0) result="ok" ;;
        124|137) result="TIMED OUT (bound ${bound} s)"; failed=1 ;;
        *) result="FAILED (exit $rc)"; failed=1 ;;
    esac
    say "== $name: $result in $((SECONDS - t0)) s"
    record "$name" "$result" "$((SECONDS - t0))"
}

install_wheels() {  # the wheels step's command: check, then (not in the rehearsal) install
    shopt -s nullglob
    local files=("$wheels"/*.whl)
    if [[ ${#files[@]} -eq 0 ]]; then
        echo "gpu_check: no wheels in $wheels (bring them with scripts/gpu_wheels.sh)"
        return 2
    fi
    "$python" -m tests.scripts.wheel_tags "$wheels" || return $?
    if [[ "$rehearse" == 1 ]]; then
        echo "gpu_check: rehearsal: wheels checked, not installed (this environment has the packages)"
        return 0
    fi
    if "$python" -m pip --version >/dev/null 2>&1; then
        "$python" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$scratch/site" "${files[@]}"
    else  # no pip: a wheel is a zip archive laid out for site-packages
        local wheel
        for wheel in "${files[@]}"; do "$python" -m zipfile -e "$wheel" "$scratch/site" || return 1; done
    fi
}
export -f install_wheels
export wheels rehearse python scratch

# --- the steps ---------------------------------------------------------------------------------------------------
say "gpu_check: $([[ "$rehearse" == 1 ]] && echo "REHEARSAL (Gloo for NCCL) " )into $out, budget ${budget} s, $(date -u '+%Y-%m-%d %H:%M UTC')"
command -v nvidia-smi >/dev/null && nvidia-smi -L 2>&1 | tee -a "$log"
run_step facts 60 "$python" -m tests.scripts.gpu_facts "$out/facts.json"
if [[ "$rehearse" == 1 && ! -d "$wheels" ]]; then
    skip_step wheels "rehearsal: no wheel folder $wheels; this environment has the packages"
else
    run_step wheels 120 bash -c install_wheels
    [[ -d "$scratch/site" ]] && export PYTHONPATH="$scratch/site:$PYTHONPATH"
fi
# The CUDA devices the facts step counted (no second torch import); 0 where it could not.
gpus="$(timeout 30 "$python" -c 'import json, sys; print(int(json.load(open(sys.argv[1])).get("cuda_devices") or 0))' \
    "$out/facts.json" 2>/dev/null)"
gpus="${gpus:-0}"
say "gpu_check: $gpus CUDA devices"
run_step status 60 "$python" -m nemo_rl_shim status
# -o addopts: the project's own options run xdist workers; the GPU tests spawn their own ranks.
run_step "pytest -m gpu" 180 "$python" -m pytest -o addopts="--strict-markers -ra" -m gpu tests/test_gpu.py -v -rs \
    -p no:cacheprovider
harvest_mode=()
[[ "$rehearse" == 1 ]] && harvest_mode=(--rehearse)
run_step harvest 200 "$python" -m tests.scripts.gpu_harvest "$scratch/harvest" "${harvest_mode[@]}" \
    --rank-bound-s 60 --dump-bound-s 25 "${harvest_args[@]}"
if [[ -d "$scratch/harvest" ]]; then
    tar -czf "$out/harvest.tar.gz" -C "$scratch/harvest" . 2>&1 | tee -a "$log"
    run_step "hang-report on the harvest" 60 "$python" -m tests.scripts.real_nccl_check "$scratch/harvest"
else
    skip_step "hang-report on the harvest" "the harvest left no folder"
fi
if [[ "$rehearse" == 1 ]]; then
    run_step preflight 150 env NEMO_RL_SHIM_PREFLIGHT_ONE_GPU_REHEARSAL=1 "$python" -m nemo_rl_shim preflight \
        --timeout-s 120
    run_step default-timeout 120 "${DEFAULT_TIMEOUT_CMD[@]}" --cpu
else
    run_step preflight 150 "$python" -m nemo_rl_shim preflight --timeout-s 120
    run_step default-timeout 120 "${DEFAULT_TIMEOUT_CMD[@]}"
fi
two_rank=("two-rank: gpu_mesh_timeouts" "two-rank: gpu_flight_recorder --nproc 2" \
          "two-rank: gpu_flight_recorder --nproc 2 --torch-only")
if ((gpus >= 2)); then
    run_step "${two_rank[0]}" 150 "$python" -m tests.scripts.gpu_mesh_timeouts
    run_step "${two_rank[1]}" 150 "$python" -m tests.scripts.gpu_flight_recorder --nproc 2
    run_step "${two_rank[2]}" 150 "$python" -m tests.scripts.gpu_flight_recorder --nproc 2 --torch-only
else
    for name in "${two_rank[@]}"; do skip_step "$name" "$gpus CUDA device(s), needs 2"; done
fi

# --- the table, and the layout the device tool brings back ---------------------------------------------------------
total=$((SECONDS - started))
record total "$([[ "$failed" == 0 ]] && echo ok || echo "FAILED: a step failed or ran past its bound")" "$total"
{
    awk -F '\t' '{ printf "%-52s %-58s %s\n", $1, $2, $3 }' "$steps"
} > "$out/table.txt"
size="$(stat -c %s "$log")"
if ((size > LOG_KEEP_BYTES)); then  # keep the end, where the table and the last steps are
    tail -c "$LOG_KEEP_BYTES" "$log" > "$scratch/log" && mv "$scratch/log" "$log"
fi
say ""
tee -a "$log" < "$out/table.txt"
files="$(find "$out" -type f | wc -l)"
deep="$(find "$out" -mindepth 3 -type f | wc -l)"
big="$(find "$out" -type f -size +16M | wc -l)"
odd="$(find "$out" -mindepth 1 -name '*[!A-Za-z0-9._-]*' | wc -l)"
layout="layout: $files files, $deep deeper than 2 folders, $big over 16 MiB, $odd with other characters in the name"
if ((files <= 8 && deep == 0 && big == 0 && odd == 0)); then
    say "$layout: fits the device tool"
else
    say "$layout: DOES NOT fit the device tool (8 files, 16 MiB, 2 folders)"
    failed=1
fi
exit "$failed"
