"""The vectorisable exp / sigmoid / expm1 of nbqat.kernels.nn_cpu against longdouble NumPy."""

import numpy as np
import pytest
from numba import njit

from nbqat.kernels import nn_cpu


@njit(cache=False)
def _apply(x, y, which):
    for i in range(x.size):
        if which == 0:
            y[i] = nn_cpu.vexp(x[i])
        elif which == 1:
            y[i] = nn_cpu.vsigmoid(x[i])
        else:
            y[i] = nn_cpu.vexpm1(x[i])


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
    assert np.signbit(_run(np.array([-0.0], dtype), 2)[0])  # expm1(-0.0) = -0.0
    assert s[1] == 1 and s[3] == 0.5 and e[3] == 1
    assert s[2] == 0 and e[2] == 0 and e[1] == np.inf
    big = np.array([89.0, -88.0, -1e30], dtype)  # overflow / below the normal range
    assert _run(big, 1)[1] >= 0 and _run(big, 1)[2] == 0
    if dtype == np.float32:
        assert _run(big, 0)[0] == np.inf  # float32 overflow, as expf


def test_glu_nonfinite_matches_torch(torch):
    """The GLU's fused float32 sigmoid handles inf / huge gates as torch.nn.functional.glu:
    -inf * sigmoid(-inf) is NaN, a huge value times a gate that underflows is 0."""
    from nbqat.nn.layers import GatedLinearUnit
    from nbqat.nn.params import ParameterBuffer

    glu = GatedLinearUnit(2, 2)
    ParameterBuffer(glu, np.float32, 0)
    x = np.array([[np.inf, 0], [-np.inf, 1], [1e30, -1e30], [3.0, -2.0]], np.float32)
    y = glu.forward(x)
    tz = torch.from_numpy(x) @ torch.from_numpy(glu.fc.weight).T + torch.from_numpy(glu.fc.bias)
    ref = torch.nn.functional.glu(tz, -1).numpy()
    assert np.array_equal(np.isnan(y), np.isnan(ref))
    fin = ~np.isnan(ref)
    np.testing.assert_allclose(y[fin], ref[fin], rtol=1e-6)
