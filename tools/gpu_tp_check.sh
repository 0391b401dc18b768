#!/usr/bin/env bash
# On a machine with two GPUs: build metrale, run the tensor-parallel tests (the
# host protocol and the two-GPU peer mapping) and bench/bench_tp.py under
# torchrun; logs go to $OUT (default ./gpu-tp-out).
#   bash tools/gpu_tp_check.sh
# Needs what tools/gpu_reserve_check.sh needs (wheels in .whl/ are installed
# first when present), plus torch with NCCL, CuPy and torchrun on PATH.
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu-tp-out}
TAIL=40
. tools/gpu_common.sh
nvidia-smi topo -m >"$OUT/topo.log" 2>&1
step tests "$PY" -m pytest -q -p no:cacheprovider -rs tests/test_tp.py tests/test_tp_cuda.py
step bench "$PY" -m torch.distributed.run --nproc-per-node 2 bench/bench_tp.py --tokens 8192 --runs 50
rm -rf "$site"
exit $status
