#!/usr/bin/env bash
# On a GPU machine, within one lent call: build metrale, run the device tests of
# the offload engine (sleep, wake, offload, the pool, torch's pool), the offload
# and pool tests again under compute-sanitizer memcheck, and the benchmarks of
# the buffers' and the pool's offload (bench_reserve.py, bench_torch_pool.py
# part b); each step under its own time limit, logs in $OUT (default
# ./gpu-offload-out).  Wheels in .whl/ are installed first (meson-python).
#   bash tools/gpu_offload_check.sh
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu-offload-out}
TAIL=${TAIL:-15}
. tools/gpu_common.sh
nvidia-smi >"$OUT/nvidia-smi.log" 2>&1
export METRALE_REQUIRE_GPU=1
T=(timeout -k 10)
step tests "${T[@]}" 90 "$PY" -m pytest -q -p no:cacheprovider -rs -m gpu tests/test_offload_cuda.py \
    tests/test_pool_cuda.py
SAN=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
step bench_pool "${T[@]}" 110 "$PY" bench/bench_torch_pool.py --part b --runs 5 --no-tms
step memcheck "${T[@]}" 110 "$SAN" --tool memcheck --error-exitcode 9 "$PY" -m pytest -q \
    -p no:cacheprovider -m gpu tests/test_offload_cuda.py tests/test_pool_cuda.py
step bench_reserve "${T[@]}" 40 "$PY" bench/bench_reserve.py --runs 5
rm -rf "$site"
exit $status
