#!/usr/bin/env bash
# On a GPU machine, within one lent call: build metrale, run every device test,
# the tests of the wake contracts and of classes sleeping apart (buffers, the
# pool, a guarded torch graph over a staged wake) again under compute-sanitizer
# memcheck, and the benchmark of a class's wake and of a guarded replay
# (bench_wake_classes.py); each step under its own time limit, logs in $OUT
# (default ./gpu-classes-out).  Wheels in .whl/ are installed first (meson-python).
#   bash tools/gpu_classes_check.sh
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu-classes-out}
TAIL=${TAIL:-25}
. tools/gpu_common.sh
nvidia-smi >"$OUT/nvidia-smi.log" 2>&1
export METRALE_REQUIRE_GPU=1
T=(timeout -k 10)
step tests "${T[@]}" 330 "$PY" -m pytest -q -p no:cacheprovider -rs -m gpu tests
SAN=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
step memcheck "${T[@]}" 120 "$SAN" --tool memcheck --error-exitcode 9 "$PY" -m pytest -q \
    -p no:cacheprovider -m gpu tests/test_offload_cuda.py tests/test_pool_cuda.py \
    "tests/test_torch_cuda.py::test_a_guarded_graph_refuses_a_replay_until_every_class_it_uses_is_awake"
step bench_classes "${T[@]}" 100 "$PY" bench/bench_wake_classes.py --runs 10
rm -rf "$site"
exit $status
