"""Benchmarks run with ``python -m pytest benchmarks --benchmark-enable -s``.

``NBQAT_BENCH_SMALL=1`` shrinks every size (a smoke run that checks the benchmarks still run).
"""

import os
import sys

sys.path.insert(0, os.path.dirname(__file__))

SMALL = bool(os.environ.get("NBQAT_BENCH_SMALL"))
