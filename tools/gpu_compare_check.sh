#!/usr/bin/env bash
# On a GPU machine: this tree and an older one (a source tree at OLD), built
# side by side, timed against each other: bench/compare_trees.py (the host
# paths, alternating processes), then each tree's own bench_cuda.py (zeroing
# and accessors on the device) and bench_reserve.py (reserved arenas, sleep
# and wake).  For a refactor that must not slow anything; logs go to $OUT.
#   OLD=path/to/old/tree bash tools/gpu_compare_check.sh
# Needs what tools/gpu_reserve_check.sh needs (wheels in .whl/ for meson-python).
set -u
cd "$(dirname "$0")/.."
OLD=${OLD:?the older source tree}
OUT=${OUT:-$PWD/gpu-compare-out}
TAIL=40
. tools/gpu_common.sh
step build_old "$PY" -m pip install --no-build-isolation --no-deps --no-index --target "$site/old" "$OLD"
# One interpreter per tree: the same python, each tree first on its path.
for t in old new; do
    pkg=$site/old; [ $t = new ] && pkg=$site/pkg
    printf '#!/bin/sh\nPYTHONPATH=%s:%s exec %s "$@"\n' "$pkg" "$site/deps" "$(command -v "$PY")" \
        > "$site/py_$t"
    chmod +x "$site/py_$t"
done
nvidia-smi >"$OUT/nvidia-smi.log" 2>&1
step compare "$PY" bench/compare_trees.py "$site/py_old" "$site/py_new" --rounds ${ROUNDS:-9}
for t in old new; do
    tree=$OLD; [ $t = new ] && tree=.
    step "cuda_$t" "$site/py_$t" "$tree/bench/bench_cuda.py" --runs ${RUNS:-50}
    step "reserve_$t" "$site/py_$t" "$tree/bench/bench_reserve.py" --runs ${RUNS:-30}
done
rm -rf "$site"
exit $status
