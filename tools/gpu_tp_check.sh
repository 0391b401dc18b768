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
mkdir -p "$OUT"
PY=${PYTHON:-python3}
site=$(mktemp -d)
status=0
step() {   # step NAME COMMAND...: run, log to $OUT/NAME.log, remember a failure
    local name=$1; shift
    echo "== $name: $*"
    "$@" >"$OUT/$name.log" 2>&1
    local rc=$?
    tail -n 40 "$OUT/$name.log"
    echo "== $name: exit $rc"
    [ $rc -eq 0 ] || status=1
}
if ls .whl/*.whl >/dev/null 2>&1; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --target "$site/deps" .whl/*.whl || exit 1
    export PYTHONPATH="$site/deps${PYTHONPATH:+:$PYTHONPATH}"
fi
step build "$PY" -m pip install --no-build-isolation --no-deps --no-index --target "$site/pkg" .
[ $status -eq 0 ] || { echo "build failed: see $OUT/build.log"; exit 1; }
export PYTHONPATH="$site/pkg:$PYTHONPATH"
nvidia-smi topo -m >"$OUT/topo.log" 2>&1
step tests "$PY" -m pytest -q -p no:cacheprovider -rs tests/test_tp.py tests/test_tp_cuda.py
step bench "$PY" -m torch.distributed.run --nproc-per-node 2 bench/bench_tp.py --tokens 8192 --runs 50
rm -rf "$site"
exit $status
