#!/usr/bin/env bash
# On a GPU machine: build metrale, run every device test (pytest -m gpu: the
# tests marked gpu, each failing rather than skipping if it finds no device),
# the reserved-arena ones again under compute-sanitizer memcheck, and
# bench/bench_reserve.py; logs go to $OUT (default ./gpu-reserve-out).
#   bash tools/gpu_reserve_check.sh
# Needs python3 with cuda-bindings 13, meson, ninja, Cython and meson-python,
# torch for the graph tests and the benchmark, and compute-sanitizer on PATH
# (or under /usr/local/cuda/bin) for the memcheck step.  Wheels in .whl/ are
# installed first when present: the lent H200 image lacks meson-python, so
# before carrying the tree there run (on a machine with an index)
#   pip download --no-deps --only-binary=:all: -d .whl meson-python pyproject-metadata
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu-reserve-out}
TAIL=25
. tools/gpu_common.sh
nvidia-smi >"$OUT/nvidia-smi.log" 2>&1
export METRALE_REQUIRE_GPU=1
step tests "$PY" -m pytest -q -p no:cacheprovider -rs -m gpu tests
SAN=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
if [ -x "$SAN" ]; then
    step memcheck "$SAN" --tool memcheck --error-exitcode 9 "$PY" -m pytest -q -p no:cacheprovider \
        -m gpu tests/test_reserve.py tests/test_offload_cuda.py tests/test_pool_cuda.py
else
    echo "compute-sanitizer not found: memcheck skipped" | tee "$OUT/memcheck.log"
fi
step bench "$PY" bench/bench_reserve.py --runs 30
rm -rf "$site"
exit $status
