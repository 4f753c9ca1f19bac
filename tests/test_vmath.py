"""nbqat.kernels.vmath: the vectorisable exp / sigmoid against float64 (and longdouble) NumPy."""

import numpy as np
import pytest
from numba import njit

from nbqat.kernels import vmath


@njit(cache=False)
def _apply(x, y, which):
    for i in range(x.size):
        if which == 0:
            y[i] = vmath.exp(x[i])
        elif which == 1:
            y[i] = vmath.sigmoid(x[i])
        else:
            y[i] = vmath.expm1(x[i])


def _run(x, which):
    y = np.empty_like(x)
    _apply(x, y, which)
    return y


def _grid(dtype):
    return np.concatenate(
        [np.linspace(-87, 88, 20001), np.linspace(-1, 1, 4001), np.linspace(-1e-4, 1e-4, 401)]
    ).astype(dtype)


@pytest.mark.parametrize(("dtype", "max_ulp"), [(np.float32, 1.5), (np.float64, 1.0)])
def test_exp_accuracy(dtype, max_ulp):
    x = _grid(dtype)
    y = _run(x, 0)
    ref = np.exp(x.astype(np.longdouble))
    rel = np.abs((y - ref) / ref).astype(np.float64)
    assert rel.max() <= max_ulp * np.finfo(dtype).eps


@pytest.mark.parametrize(("dtype", "max_ulp"), [(np.float32, 1.5), (np.float64, 1.5)])
def test_sigmoid_accuracy(dtype, max_ulp):
    x = np.concatenate([_grid(dtype), np.array([-100, -30, 30, 100], dtype)])
    y = _run(x, 1)
    xl = x.astype(np.longdouble)
    ref = 1 / (1 + np.exp(-xl))
    big = ref > 1e-30  # below: float32 clamps at exp(88.38) (documented)
    rel = np.abs((y[big] - ref[big]) / ref[big]).astype(np.float64)
    assert rel.max() <= max_ulp * np.finfo(dtype).eps
    assert np.all((y >= 0) & (y <= 1))


@pytest.mark.parametrize(("dtype", "max_ulp"), [(np.float32, 2.0), (np.float64, 1.0)])
def test_expm1_accuracy(dtype, max_ulp):
    x = np.concatenate([_grid(dtype), np.linspace(-0.6, 0.6, 12001).astype(dtype)])
    x = x[x != 0]
    y = _run(x, 2)
    ref = np.expm1(x.astype(np.longdouble))
    rel = np.abs((y - ref) / ref).astype(np.float64)
    assert rel.max() <= max_ulp * np.finfo(dtype).eps


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_special_values(dtype):
    x = np.array([np.nan, np.inf, -np.inf, 0.0], dtype)
    e = _run(x, 0)
    s = _run(x, 1)
    m = _run(x, 2)
    assert np.isnan(e[0]) and np.isnan(s[0]) and np.isnan(m[0])
    assert m[2] == -1 and m[3] == 0
    assert s[1] == 1 and s[3] == 0.5 and e[3] == 1
    assert 0 <= s[2] < 1e-38 and 0 <= e[2] < 1.2e-38 * 1.0001
    assert e[1] > 1e38  # float32: 2.4e38 (clamped), float64: inf
