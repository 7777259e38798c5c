#!/usr/bin/env bash
# `make test`: the real-vLLM tier (pytest -m vllm) and the rest of the suite side by side, as
# two pytest processes. The vLLM tier mostly waits on real time (load phases against vLLM on
# the CPU), so the rest runs beside it instead of after it. Both outputs are printed (the
# vLLM tier's after the rest's); the exit status fails when either tier fails.
#
#   bash scripts/test-tiers.sh PYTHON [pytest args...]
set -u
py=${1:?usage: test-tiers.sh PYTHON [pytest args...]}
shift
log=$(mktemp -t slokit-vllm-tier.XXXXXX)
"$py" -m pytest -q -m vllm -p no:cacheprovider "$@" >"$log" 2>&1 &
vllm_pid=$!
stop_vllm_tier() {
    kill -INT "$vllm_pid" 2>/dev/null  # KeyboardInterrupt: its fixtures stop their servers
    wait "$vllm_pid" 2>/dev/null
    rm -f "$log"
    exit 130
}
trap stop_vllm_tier INT TERM
started=$(date +%s)
"$py" -m pytest -q -m "not vllm" "$@"
rest=$?
echo "test-tiers: the rest finished in $(( $(date +%s) - started )) s (rc $rest); waiting for the real-vLLM tier"
wait "$vllm_pid"
vllm=$?
trap - INT TERM
echo "=================== the real-vLLM tier (pytest -m vllm) ==================="
cat "$log"
rm -f "$log"
# 5: pytest collected nothing in that tier (arguments that name no test of it)
[ "$rest" -eq 5 ] && rest=0
[ "$vllm" -eq 5 ] && vllm=0
echo "test-tiers: both done in $(( $(date +%s) - started )) s; rest rc $rest, real-vLLM tier rc $vllm"
[ "$rest" -eq 0 ] && [ "$vllm" -eq 0 ]
