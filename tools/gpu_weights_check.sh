#!/usr/bin/env bash
# On a GPU machine, within one lent call: build metrale, run the weights' tests
# (host ones too: torch and transformers are there), the doc blocks, and
# bench/bench_refit.py (a trainer process refits it through one export, the RL
# loop) and bench/bench_weights.py (a transformers Qwen3 on a weight arena, its
# graph in an activation arena's pool, the deep sleep); each step under its own time
# limit, logs in $OUT (default ./gpu-weights-out).  Wheels in .whl/ are
# installed first (meson-python).
#   bash tools/gpu_weights_check.sh [CONFIG]
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu-weights-out}
TAIL=${TAIL:-30}
. tools/gpu_common.sh
nvidia-smi >"$OUT/nvidia-smi.log" 2>&1
export METRALE_REQUIRE_GPU=1
T=(timeout -k 10)
step tests "${T[@]}" 120 "$PY" -m pytest -q -p no:cacheprovider -rs tests/test_weights*.py \
    tests/test_refit*.py tests/test_torch.py tests/test_doc_blocks.py
step bench_refit "${T[@]}" 200 "$PY" bench/bench_refit.py --config "${1:-tests/data/hf/qwen3-8b.json}" --runs 5 --cycles 20
step bench_weights "${T[@]}" 110 "$PY" bench/bench_weights.py --config "${1:-tests/data/hf/qwen3-8b.json}" --runs 5
rm -rf "$site"
exit $status
