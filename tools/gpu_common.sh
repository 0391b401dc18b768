# Sourced by the tools/gpu_*_check.sh scripts: from the repository root, with
# OUT (the log folder) and TAIL (lines of each log to show) set.  Installs the
# wheels carried in .whl/ (the lent GPU image lacks meson-python), builds
# metrale into a temporary site, and defines `step`; the caller ends with
#   rm -rf "$site"; exit $status
mkdir -p "$OUT"
PY=${PYTHON:-python3}
site=$(mktemp -d)
status=0
step() {   # step NAME COMMAND...: run, log to $OUT/NAME.log, remember a failure
    local name=$1; shift
    echo "== $name: $*"
    "$@" >"$OUT/$name.log" 2>&1
    local rc=$?
    tail -n "$TAIL" "$OUT/$name.log"
    echo "== $name: exit $rc"
    [ $rc -eq 0 ] || status=1
}
if ls .whl/*.whl >/dev/null 2>&1; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --target "$site/deps" .whl/*.whl || exit 1
    export PYTHONPATH="$site/deps${PYTHONPATH:+:$PYTHONPATH}"
fi
step build "$PY" -m pip install --no-build-isolation --no-deps --no-index --target "$site/pkg" .
[ $status -eq 0 ] || { echo "build failed: see $OUT/build.log"; exit 1; }
export PYTHONPATH="$site/pkg${PYTHONPATH:+:$PYTHONPATH}"
