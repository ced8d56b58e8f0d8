#!/usr/bin/env bash
# The server's GPU figures (README, "The server on a GPU"), in one call of a lent GPU machine:
#
#     bash netem/results-gpu/run.sh            # from the repository root, edgespec installed; logs in $OUT
#
# 1. the engine tests that take a CUDA device (every `DEVICES` test's cuda case: token-exact against the
#    target's greedy output, graphs and eager; the no-synchronisation test);
# 2. netem/results-gpu/step_layers.py (the decode step's time, layer by layer) and `edgespec bench server`
#    on random weights in the 1.5B's and the 7B's shapes (real weights are gigabytes
#    and a call carries 64 MiB; a forward's cost depends on shapes, not weights), the generic engine, the
#    batched engine without graphs and with a CUDA graph per bucket, in one run each.
# Each step has a time cap and the whole a budget (BUDGET seconds), so a failing step leaves the others
# their time; the 7B's weights are drawn while the 1.5B runs. BENCH_ARGS replaces the bench's engines and
# sizes; RUN_TESTS=0 skips the tests.
set -u
OUT=${OUT:-gpu-out}
mkdir -p "$OUT"
BUDGET=${BUDGET:-500}
ES=(edgespec)
command -v edgespec >/dev/null || ES=(python3 -m edgespec)
START=$(date +%s)
left() { echo $((BUDGET - ($(date +%s) - START))); }
step() {  # step NAME CAP COMMAND...: run it with its output in $OUT/NAME.log, within CAP and the budget
    local name=$1 cap=$2 l
    shift 2
    l=$(left)
    ((l < cap)) && cap=$l
    if ((cap < 20)); then
        echo "## $name: skipped, ${l}s of the budget left" | tee -a "$OUT/summary.txt"
        return
    fi
    local t0
    t0=$(date +%s)
    timeout "$cap" "$@" >"$OUT/$name.log" 2>&1
    echo "## $name: rc $? in $(($(date +%s) - t0)) s (cap ${cap}s)" | tee -a "$OUT/summary.txt"
}

{ nvidia-smi; python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers',
transformers.__version__, torch.cuda.get_device_name(0))"; } >"$OUT/machine.txt" 2>&1
cat "$OUT/machine.txt" | grep -E "torch|NVIDIA|Driver" | head -5

step random-1.5b 90 "${ES[@]}" models random /tmp/rnd-1.5b --like qwen2.5-coder-1.5b-instruct --device cuda
"${ES[@]}" models random /tmp/rnd-7b --like qwen2.5-coder-1.5b-instruct --shape 7b --device cuda \
    >"$OUT/random-7b.log" 2>&1 &
GEN7B=$!
BENCH=("${ES[@]}" bench server --dtype bfloat16 --context 512)
read -r -a BENCH_ARGS <<<"${BENCH_ARGS:---engines generic batched-eager batched --sessions 1 4 16 64 --seconds 2 --warmup 2 --repeats 10}"
bench() {  # bench MODEL_DIR: the decode step's layers, then the engines side by side
    python3 netem/results-gpu/step_layers.py "$1"; "${BENCH[@]}" "${BENCH_ARGS[@]}" --models "$1"
}
step bench-1.5b 200 bash -c "$(declare -p BENCH BENCH_ARGS); $(declare -f bench); bench /tmp/rnd-1.5b"
wait "$GEN7B"
echo "## random-7b: rc $?" | tee -a "$OUT/summary.txt"
step bench-7b 200 bash -c "$(declare -p BENCH BENCH_ARGS); $(declare -f bench); bench /tmp/rnd-7b"
cat "$OUT"/random-*.log >>"$OUT/setup.log" && rm -f "$OUT"/random-*.log
[ "${RUN_TESTS:-1}" = 1 ] && step tests 150 python3 -m pytest -q -p no:cacheprovider -k cuda \
    tests/server/test_engine_step.py tests/server/test_engine.py tests/server/test_session.py \
    tests/shared/test_verification.py tests/server/test_prefix_cache.py && tail -3 "$OUT/tests.log"
cat "$OUT/summary.txt"
for b in bench-1.5b bench-7b; do [ -f "$OUT/$b.log" ] && grep -E "^(engine|#|\|)" "$OUT/$b.log" | cut -c1-200; done
