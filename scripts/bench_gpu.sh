#!/usr/bin/env bash
# `make bench-gpu` (docs/gpu.md), also runnable where make is not installed:
#   bash scripts/bench_gpu.sh [bench/gpu.py's options]
# On a GPU node with no internet: makes GPU_VENV, a venv over the node's own
# Python and torch (GPU_PYTHON; a .pth file adds its site-packages, whose pip
# then installs), puts the lock's versions of fedrl's dependencies there from
# WHEELHOUSE (`make wheelhouse`) and fedrl from this tree, and runs
# bench/gpu.py, which writes one JSON file, BENCH_GPU_OUT.
set -euo pipefail
cd "$(dirname "$0")/.."
GPU_PYTHON=${GPU_PYTHON:-python3}
GPU_VENV=${GPU_VENV:-.venv-gpu}
WHEELHOUSE=${WHEELHOUSE:-wheelhouse}
BENCH_GPU_OUT=${BENCH_GPU_OUT:-bench-gpu.json}

version=$("$GPU_PYTHON" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
listing="$WHEELHOUSE/requirements-$version.txt"
if [ ! -f "$listing" ]; then
    echo "no $listing: run 'make wheelhouse WHEEL_PYTHONS=$version' where an index is" \
        "reachable, and bring $WHEELHOUSE/ along" >&2
    exit 1
fi
"$GPU_PYTHON" -c 'import sys, torch
print(sys.executable, sys.version.split()[0], "torch", torch.__version__, "CUDA",
      torch.version.cuda, "GPU", torch.cuda.is_available())'
[ -x "$GPU_VENV/bin/python" ] || "$GPU_PYTHON" -m venv --without-pip "$GPU_VENV"
node_site=$("$GPU_PYTHON" -c 'import site; print(site.getsitepackages()[0])')
venv_site=$("$GPU_VENV/bin/python" -c 'import site; print(site.getsitepackages()[0])')
echo "$node_site" > "$venv_site/node.pth"
install=("$GPU_VENV/bin/python" -m pip install --quiet --no-index --no-deps)
"${install[@]}" --find-links "$WHEELHOUSE" -r "$listing"
"${install[@]}" --no-build-isolation .
exec "$GPU_VENV/bin/python" bench/gpu.py --out "$BENCH_GPU_OUT" "$@"
