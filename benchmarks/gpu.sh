#!/usr/bin/env bash
# The GPU benchmark, unattended: `bash benchmarks/gpu.sh` on a CUDA machine (about 6 minutes; see
# benchmarks/gpu.py). Results in benchmarks/results/gpu.json and gpu.md. Exit status 2: no CUDA device.
set -euo pipefail
cd "$(dirname "$0")/.."
# The project's virtual environment (made on first use), or the interpreter named by $PROJECT_PYTHON.
python=${PROJECT_PYTHON:-.venv/bin/python}
if [ -z "${PROJECT_PYTHON:-}" ] && [ ! -x "$python" ]; then
  make install >/dev/null
fi
# glibc's default malloc thresholds make timings swing; these pin them (as the Makefile does).
export MALLOC_MMAP_THRESHOLD_=${MALLOC_MMAP_THRESHOLD_:-33554432} MALLOC_TRIM_THRESHOLD_=${MALLOC_TRIM_THRESHOLD_:-1073741824}
exec "$python" -m benchmarks.gpu "$@"
