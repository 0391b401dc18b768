#!/usr/bin/env bash
# On a GPU machine, within one short lent call: build metrale, then run
# bench/bench_refit.py (a trainer process refits a transformers Qwen3 through
# one export, the RL loop), the refit's and the weights' GPU tests,
# bench/bench_weights.py (the deep sleep) and bench/bench_context.py (where the
# context grows, step by step); logs in $OUT.  Wheels in .whl/ are installed
# first (meson-python).
#   bash tools/gpu_refit_check.sh [CONFIG]
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu-refit-out}
TAIL=${TAIL:-30}
. tools/gpu_common.sh
export METRALE_REQUIRE_GPU=1
T=(timeout -k 10)
step bench_refit "${T[@]}" ${REFIT_S:-170} "$PY" bench/bench_refit.py --config "${1:-tests/data/hf/qwen3-8b.json}" --runs 5 --cycles 20
step tests "${T[@]}" 150 "$PY" -m pytest -q -p no:cacheprovider -rs tests/test_refit_cuda.py \
    tests/test_weights_cuda.py tests/test_cuda.py::test_trim_stack_gives_the_grown_stack_back
step bench_weights "${T[@]}" ${WEIGHTS_S:-100} "$PY" bench/bench_weights.py --config "${1:-tests/data/hf/qwen3-8b.json}" --runs 3
step context "${T[@]}" ${CONTEXT_S:-90} "$PY" bench/bench_context.py --config "${1:-tests/data/hf/qwen3-8b.json}"
rm -rf "$site"
exit $status
