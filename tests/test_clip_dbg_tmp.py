"""Gradient clipping against torch.nn.utils (oracle) and an exact float64 NumPy reference."""

from __future__ import annotations

import math

import numba
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from ref_clip import clip_coef32, exact_total_norm

import nbqat
from nbqat import clip as C
from nbqat.kernels import norm_cpu as K

NORMS = [2.0, 1.0, 3.5, math.inf]
DTYPES = [np.float32, np.float64, np.float16]

def test_x(cuda_sim):
    pass
def test_y():
    import numba, os
    from nbqat import _cuda
    print("SIM", numba.config.ENABLE_CUDASIM, os.environ.get("NUMBA_ENABLE_CUDASIM"), _cuda.cuda, _cuda.cuda_available())
    try:
        print(_cuda.cuda.is_available())
    except Exception as e:
        print("ERR", e)
