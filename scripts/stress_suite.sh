#!/usr/bin/env bash
# The suite on a shared machine: the README's test command in two fresh clones at the same time, then in one
# clone beside a CPU hog per core. Every run is bounded (timeout), and every failing test is listed.
#
#   scripts/stress_suite.sh [ROUNDS]       ROUNDS rounds of "two clones at once" (default 2), then one
#                                          run beside the hogs; exit 0 only when every run passed
#
# Clones HEAD of this checkout (committed work only), each into its own temp dir with its own .venv
# (`uv sync --locked`, as CI does), so the two runs share nothing but the machine: its cores, its ports, its
# /tmp and its uv cache. What each run printed is kept under $STRESS_DIR (default: a new temp dir) and a
# line per run goes to $STRESS_DIR/summary.txt, in the form docs/testing.md records.
# NEMO_RL_SHIM_STRESS_TIMEOUT_S bounds one run (default 2400 s: a run alone takes about 8 min on 2 cores).
set -euo pipefail
cd "$(dirname "$0")/.."
read -r -a UV <<< "${NEMO_RL_SHIM_UV:-uv}"
rounds="${1:-2}"
bound="${NEMO_RL_SHIM_STRESS_TIMEOUT_S:-2400}"
out="${STRESS_DIR:-$(mktemp -d -t nemo-rl-shim-stress.XXXXXX)}"
mkdir -p "$out"
head_sha="$(git rev-parse --short HEAD)"
cores="$(nproc)"
hogs=()

end_hogs() {
    for pid in "${hogs[@]:-}"; do [[ -n "$pid" ]] && kill "$pid" 2>/dev/null || true; done
    hogs=()
}
trap end_hogs EXIT

clone() {  # clone NAME: a fresh clone of HEAD with its locked environment
    local dir="$out/$1"
    rm -rf "$dir"
    git clone --quiet --no-hardlinks "$PWD" "$dir"
    git -C "$dir" checkout --quiet "$head_sha"
    (cd "$dir" && "${UV[@]}" sync --quiet --locked --extra automodel --extra ray)
}

suite() {  # suite NAME LOG: the README's test command in clone NAME, bounded, as on a fresh clone (no pytest
    local rc=0  # cache, so the files go in a fresh clone's order); prints its exit code
    rm -rf "$out/$1/.pytest_cache"
    (cd "$out/$1" && timeout --kill-after=30 "$bound" \
        "${UV[@]}" run --locked --extra automodel --extra ray pytest) >"$2" 2>&1 || rc=$?
    echo "$rc"
}

record() {  # record WHAT NAME LOG RC START: one summary line, with the failing tests
    local what="$1" name="$2" log="$3" rc="$4" start="$5"
    local tally failed
    tally="$(grep -Eo '[0-9]+ (passed|failed|skipped|error|errors)' "$log" | tr '\n' ' ' | sed 's/ $//' || true)"
    failed="$(grep -E '^(FAILED|ERROR) ' "$log" | cut -d' ' -f2 | tr '\n' ' ' || true)"
    printf '%s %s %s: exit %s in %s s, %s, load %s%s\n' "$(date -u +%FT%TZ)" "$what" "$name" "$rc" \
        "$((SECONDS - start))" "${tally:-no tally}" "$(cut -d' ' -f1-3 /proc/loadavg)" \
        "${failed:+; failed: $failed}" | tee -a "$out/summary.txt"
}

echo "stress_suite: HEAD $head_sha, $cores cores, runs under $out"
clone a
clone b
status=0
for round in $(seq 1 "$rounds"); do
    start=$SECONDS
    rc_a_file="$out/rc-a" rc_b_file="$out/rc-b"
    (suite a "$out/round$round-a.log" >"$rc_a_file") &
    pid_a=$!
    (suite b "$out/round$round-b.log" >"$rc_b_file") &
    pid_b=$!
    wait "$pid_a" "$pid_b" || true
    for name in a b; do
        rc="$(cat "$out/rc-$name")"
        record "round $round of $rounds, two clones at once:" "$name" "$out/round$round-$name.log" "$rc" "$start"
        [[ "$rc" == 0 ]] || status=1
    done
done

start=$SECONDS
for _ in $(seq 1 "$cores"); do
    python3 -c 'while True: pass' &
    hogs+=($!)
done
rc="$(suite a "$out/hogs-a.log")"
end_hogs
record "beside $cores CPU hogs (one per core):" a "$out/hogs-a.log" "$rc" "$start"
[[ "$rc" == 0 ]] || status=1

echo "stress_suite: $( [[ $status == 0 ]] && echo "every run passed" || echo "a run failed" ) (summary: $out/summary.txt)"
exit "$status"
