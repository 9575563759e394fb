#!/usr/bin/env bash
# One CI lane: a supported torch x nemo-automodel pair in its own locked environment, and its tests.
#
#   scripts/lane.sh default      the whole suite on the locked default pair (the README's test command)
#   scripts/lane.sh torch-2.11   NeMo RL's torch, with the automodel extra (nemo-automodel 0.7.0), on the default
#                                Python; CI runs this pair on CPython 3.13 instead (the lane below)
#   scripts/lane.sh torch-2.10   Automodel's own lock and the oldest torch 0.7.0 (and 0.6.0) import with
#   scripts/lane.sh torch-2.9    the oldest torch nemo-automodel 0.5.0 works with
#   scripts/lane.sh py3.13-torch-2.11  NeMo RL's own pair: torch 2.11 and nemo-automodel 0.7.0 on CPython 3.13
#                                (pyenv's $(pyenv root)/versions/3.13.*/bin/python3.13); without it the lane skips
#                                saying why, except under CI (NEMO_RL_SHIM_CI=1), where it fails
#
# Each extra lane is a dependency group of pyproject.toml pinning torch (and, for torch-2.9, nemo-automodel),
# declared as conflicting so that uv.lock holds every lane and `--locked` checks it; its environment lives
# in .lanes/<lane> (UV_PROJECT_ENVIRONMENT), beside the default .venv. Extra lanes run the multi-process
# CPU tests (mesh, set-up, timeouts, fault, decision, preflight, dry run) and the command line's; the default lane
# runs everything. Extra arguments go to pytest.
# The torch-2.9 lane is not redundant: it alone kills two mutants (measured): setup_distributed's post-build
# timeout pass made a no-op (only torch 2.9 builds sub-groups without the timeout; tests/setup/test_setup_distributed.py,
# test_timeouts.py, test_preflight.py fail there), and an unimportable Automodel reported as supported (only
# there does nemo-automodel 0.7.0 fail to import; tests/setup/test_support.py runs there and skips elsewhere).
set -euo pipefail
cd "$(dirname "$0")/.."
read -r -a UV <<< "${NEMO_RL_SHIM_UV:-uv}"  # .ci/run sets it when uv runs as "python3 -m uv"
lane="${1:?usage: scripts/lane.sh default|torch-2.11|torch-2.10|torch-2.9|py3.13-torch-2.11 [pytest args]}"
shift

case "$lane" in
    default)
        "${UV[@]}" sync --locked --extra automodel --extra ray
        exec "${UV[@]}" run --locked --extra automodel --extra ray pytest "$@" ;;
    torch-2.11) selection=(--group lane-torch-2-11 --extra automodel) ;;
    torch-2.10) selection=(--group lane-torch-2-10 --extra automodel) ;;
    torch-2.9) selection=(--group lane-torch-2-9) ;;
    py3.13-torch-2.11)
        root="$(pyenv root 2>/dev/null || true)"
        python313="$(ls "$root"/versions/3.13.*/bin/python3.13 2>/dev/null | sort -V | tail -n 1 || true)"
        if [[ -z "$python313" || ! -x "$python313" ]]; then
            echo "scripts/lane.sh: lane $lane: no CPython 3.13 (pyenv root '${root:-none}', no versions/3.13.*/bin/python3.13)" >&2
            if [[ "${NEMO_RL_SHIM_CI:-}" == 1 ]]; then exit 1; fi
            echo "scripts/lane.sh: lane $lane skipped" >&2; exit 0
        fi
        selection=(--group lane-torch-2-11 --extra automodel --python "$python313") ;;
    *) echo "scripts/lane.sh: unknown lane '$lane' (default, torch-2.11, torch-2.10, torch-2.9, py3.13-torch-2.11)" >&2; exit 2 ;;
esac
export UV_PROJECT_ENVIRONMENT=".lanes/$lane"
"${UV[@]}" sync --locked "${selection[@]}"
exec "${UV[@]}" run --locked "${selection[@]}" pytest -m every_lane "$@"
