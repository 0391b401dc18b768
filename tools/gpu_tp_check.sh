#!/usr/bin/env bash
# On a machine with two GPUs: build metrale, run the tensor-parallel host
# protocol (tests/test_tp.py, test_allreduce.py, test_detach.py), the CUDA
# tests of peer_all_reduce and detach / attach (one device each rank), every
# two-GPU test (pytest -m two_gpus: the peer mapping, the bits of NCCL and the
# torchrun doc block, failing rather than skipping if they find fewer than two
# devices), and bench/bench_tp.py under torchrun; logs go to $OUT (default
# ./gpu-tp-out).
#   bash tools/gpu_tp_check.sh
# Needs what tools/gpu_reserve_check.sh needs (wheels in .whl/ are installed
# first when present), plus torch with NCCL and torchrun on PATH.
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu-tp-out}
TAIL=40
. tools/gpu_common.sh
nvidia-smi topo -m >"$OUT/topo.log" 2>&1
step tests "$PY" -m pytest -q -p no:cacheprovider -rs tests/test_tp.py tests/test_allreduce.py tests/test_detach.py
METRALE_REQUIRE_GPU=1 step gpu "$PY" -m pytest -q -p no:cacheprovider -rs -m gpu tests/test_allreduce_cuda.py tests/test_detach_cuda.py
METRALE_REQUIRE_GPU=1 step two_gpus "$PY" -m pytest -q -p no:cacheprovider -rs -m two_gpus tests
step bench "$PY" -m torch.distributed.run --nproc-per-node 2 bench/bench_tp.py --tokens 8192 --runs 30
rm -rf "$site"
exit $status
