"""Oracle helpers of the low-bit tests: torchao 0.18 (``torchao.quantization.quant_primitives``)
loaded like the ``torch`` fixture (required in CI), and a bit comparison where NaNs are equal."""

from __future__ import annotations

import os
import warnings

import numpy as np
import pytest


def load_quant_primitives():
    """torchao's ``quant_primitives`` module (skip, or fail in CI, when torchao is missing)."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            from torchao.quantization import quant_primitives
    except ImportError:
        if os.environ.get("CI") or os.environ.get("NBQAT_REQUIRE_TORCH"):
            pytest.fail(
                "torchao is required in CI for the oracle tests: pip install torchao==0.18.0"
            )
        pytest.skip("torchao is not installed (pip install torchao==0.18.0)")
    return quant_primitives


def assert_same_bits(got, want, what=""):
    """Equal float32 bits, every NaN equal to every NaN (payloads are not compared)."""
    got = np.ascontiguousarray(got, np.float32)
    want = np.ascontiguousarray(want, np.float32)
    assert got.shape == want.shape, (what, got.shape, want.shape)
    nan = np.isnan(got) & np.isnan(want)
    ok = (got.view(np.uint32) == want.view(np.uint32)) | nan
    if not ok.all():
        i = np.flatnonzero(~ok.reshape(-1))[:5]
        raise AssertionError(
            f"{what}: {int((~ok).sum())} differ, e.g. at {i}: got {got.reshape(-1)[i]}, "
            f"want {want.reshape(-1)[i]}"
        )
