#!/usr/bin/env bash
# GPU regression check for a machine that has a CUDA build of torch but not nemo-automodel.
#
# What it runs, from the repository root, each step bounded in time:
#   1. nemo-rl-shim status                    (versions, what setup_distributed would decide)
#   2. pytest -m gpu tests/test_gpu.py        (real NCCL + Gloo, FSDP2 CPU offload, keep-cpu-backend)
#   3. nemo-rl-shim preflight                 (one rank per GPU when there are 2 or more)
#   4. python -m tests.scripts.gpu_flight_recorder    (NCCL's own dump on a timeout, read by hang-report: one rank
#                                              on one GPU, a collective held behind torch.cuda._sleep; two
#                                              ranks with two GPUs or more, rank 1 never joining; run last,
#                                              with --backend nccl and --backend nccl-legacy, each also
#                                              --torch-only: see nccl_backends below)
#   3b. python -m tests.scripts.gpu_default_timeout   (one GPU: the NeMo RL pull request's one-GPU test without NeMo RL:
#                                              torch's default for new groups set to 45 min, then a one-rank
#                                              cuda:nccl,cpu:gloo default group, a mesh sub-group and a later
#                                              group, each backend read back, with TORCH_DISTRIBUTED_DEBUG OFF and
#                                              DETAIL. NOT YET RUN ON A GPU: its logic runs on CPU with --cpu)
#   5. python -m tests.scripts.gpu_mesh_timeouts      (two GPUs or more: set_mesh_timeouts after a mesh build without
#                                              a timeout, 0.2 min read back on the NCCL and Gloo halves; an
#                                              NCCL all-reduce whose last rank never joins fails after ~12 s.
#                                              NOT YET RUN ON A GPU: written where none was available; its
#                                              logic runs on CPU with --cpu)
#
# Wheels: fetched beforehand on a machine with package-index access, for the GPU machine's
# Python (here 3.11) and platform, versions as in uv.lock:
#
#   uv run python -m pip download --no-deps --only-binary=:all: \
#       --python-version 3.11 --platform manylinux2014_x86_64 -d wheels \
#       nemo-automodel==0.7.0 megatron-fsdp==0.5.0 \
#       pyyaml==6.0.4 packaging==26.4 pytest==9.2.0 pluggy==1.7.0 iniconfig==2.3.1 pygments==2.21.0
#
# nemo-automodel's mesh modules need megatron-fsdp (imported by its distributed package);
# pyyaml and packaging are this project's own dependencies; pytest, pluggy, iniconfig and pygments run
# the tests. Everything else they import comes with torch. Copy wheels/ next to the
# repository, then:
#
#   scripts/gpu_check.sh [WHEEL_DIR]        # default: ./wheels
#
# The wheels are installed with --no-deps into a folder put first on PYTHONPATH (nothing is
# installed into the machine's Python). Environment:
#   PYTHON                 interpreter with torch (default: python3)
#   GPU_CHECK_TARGET       install folder (default: a temporary folder, removed on exit)
#   GPU_CHECK_TIMEOUT_S    bound on each step in seconds (default: 900)
#   GPU_CHECK_ONLY         "nccl-backends": only the Flight Recorder's NCCL path under both of torch 2.15's NCCL
#                          backends (the last section; a short run, each step bounded at 240 s)
# Exit status: that of the first failing step, 124 when a step ran past its bound.
#
# The section for torch 2.15's two NCCL backends (plain "nccl" is ProcessGroupNCCL2, recorded by torch's
# FlightRecorderHook; "nccl-legacy", or TORCH_DIST_USE_NCCL2=0, the stock backend) was written where no GPU was
# available (#27) and has NOT YET RUN ON A GPU. Its steps print each rank's backend class and what its recorder
# writes for a completed batch_isend_irecv (BACKEND_FACTS lines): keep that output.
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
wheels="$(cd "${1:-wheels}" && pwd)"
python="${PYTHON:-python3}"
if [ -n "${GPU_CHECK_TARGET:-}" ]; then
    target="$GPU_CHECK_TARGET"
else
    target="$(mktemp -d -t nemo-rl-shim-gpu-check.XXXXXX)"
    trap 'rm -rf "$target"' EXIT
fi
limit="${GPU_CHECK_TIMEOUT_S:-900}"

shopt -s nullglob
files=("$wheels"/*.whl)
if [ "${#files[@]}" -eq 0 ]; then
    echo "gpu_check: no wheels in $wheels (see the header of $0 for how to get them)" >&2
    exit 2
fi
if ! "$python" -c "import torch" 2>/dev/null; then
    echo "gpu_check: $python cannot import torch; set PYTHON to an interpreter that has it" >&2
    exit 2
fi

rm -rf "$target"
if "$python" -m pip --version >/dev/null 2>&1; then
    "$python" -m pip install --quiet --no-deps --no-index --target "$target" "${files[@]}"
else  # no pip: a wheel is a zip archive laid out for site-packages
    for wheel in "${files[@]}"; do "$python" -m zipfile -e "$wheel" "$target"; done
fi

export PYTHONPATH="$target:$repo${PYTHONPATH:+:$PYTHONPATH}"
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
cd "$repo"
command -v nvidia-smi >/dev/null && nvidia-smi -L || true
"$python" -c "import nemo_automodel, sys; sys.exit(0 if nemo_automodel.__file__.startswith('$target') else 1)" || {
    echo "gpu_check: nemo_automodel is not imported from $target" >&2
    exit 2
}

step() {
    echo "== $*"
    timeout --kill-after=30 "$limit" "$@"
}

# --- hang-report on the NCCL path under both of torch 2.15's NCCL backends ------------------------------------------
# 4-5. python -m tests.scripts.gpu_flight_recorder --backend nccl|nccl-legacy [--torch-only]: the watchdog timeout,
#    with the shim (TORCH_DIST_USE_NCCL2=0 picks the stock backend under its "nccl") and without it (the
#    backend named to init_process_group); hang-report must name the rank from the recorder of the backend in use
#    (nccl2 or nccl). Bounded inside: each rank at 150 s, the watchdog at 6 s. On a torch before 2.15 both names
#    run the stock backend ("nccl-legacy" does not exist there: those steps are skipped).
nccl_backends() {
    local backends=(nccl)
    if "$python" -c 'import sys, torch.distributed.distributed_c10d as c; sys.exit(0 if hasattr(c, "_create_nccl2_process_group") else 1)'; then
        backends+=(nccl-legacy)
    else
        echo "== nccl-legacy steps skipped: torch $("$python" -c 'import torch; print(torch.__version__)') has no NCCL2"
    fi
    for backend in "${backends[@]}"; do
        step "$python" -m tests.scripts.gpu_flight_recorder --backend "$backend"
        step "$python" -m tests.scripts.gpu_flight_recorder --backend "$backend" --torch-only
    done
}
if [ "${GPU_CHECK_ONLY:-}" = "nccl-backends" ]; then
    limit=240
    nccl_backends
    exit 0
fi

step "$python" -m nemo_rl_shim status
# -o addopts: the project's own pytest options run four xdist workers, and pytest-xdist is not among the wheels.
step "$python" -m pytest -o addopts="--strict-markers -ra" -m gpu tests/test_gpu.py -v -rs -p no:cacheprovider
# preflight's own bound is shorter, so that a stuck rank is reported rather than killed.
step "$python" -m nemo_rl_shim preflight --timeout-s "$((limit > 120 ? limit - 60 : limit))"
# The NeMo RL pull request's one-GPU check (nemo_rl_shim/upstream/0004's GPU test, without NeMo RL); each of its
# two fresh processes bounded at 240 s.
step "$python" -m tests.scripts.gpu_default_timeout
# Two GPUs or more (exit 2 with fewer); each rank bounded at 180 s, the stalled all-reduce at 12 s. Under both of
# torch 2.15's NCCL backends: whether NCCL2's options, which the shim reads back, hold what set_timeout gave it.
if [ "$("$python" -c 'import torch; print(torch.cuda.device_count())')" -ge 2 ]; then
    step "$python" -m tests.scripts.gpu_mesh_timeouts
    TORCH_DIST_USE_NCCL2=0 step "$python" -m tests.scripts.gpu_mesh_timeouts
else
    echo "== tests.scripts.gpu_mesh_timeouts skipped: Need 2 CUDA devices"
fi

# --- hang-report on torch's own NCCL dumps (self-contained: nothing above depends on it) ---------------------------
# 5. python -m tests.scripts.gpu_flight_recorder --torch-only: the same NCCL watchdog timeout without the shim (the
#    recorder switched on through TORCH_FR_BUFFER_SIZE, TORCH_NCCL_DUMP_ON_TIMEOUT and TORCH_FR_DUMP_TEMP_FILE
#    alone, dumps under torch's own name nccl_trace_rank_<rank>, no group map beside them); hang-report must
#    name the same rank from torch's dumps. Bounded inside too: each rank at 150 s, the watchdog at 6 s.
# Steps 4 and 5 run under each of torch 2.15's NCCL backends (nccl_backends, above).
nccl_backends
