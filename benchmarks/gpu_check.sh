#!/usr/bin/env bash
# The GPU check (see benchmarks/gpu_check.py): the CUDA tests on the device, without the
# simulator, and the CUDA benchmarks, one summary table. Uses the installed numba-cuda, torch
# and pytest and this checkout's source; downloads nothing.
#
#   benchmarks/gpu_check.sh [--dry-run] [--mib 256] [--repeat 20] [--no-tests] [--no-benchmarks]
set -euo pipefail
cd "$(dirname "$0")/.."
export NUMBA_ENABLE_CUDASIM=0
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
exec "${PYTHON:-python3}" benchmarks/gpu_check.py "$@"
