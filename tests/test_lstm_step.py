"""One float LSTM step (``nbqat.nn.layers.lstm.lstm_step``) against an obvious NumPy reference,
bit for bit: the halved i, f, o pre-activations through NumPy's ``tanh`` to
``sigmoid = 0.5 + 0.5 tanh(a / 2)``, ``c = f c_prev + i g``, ``h = o tanh(c)``; the output gate
also written to the contiguous scratch ``o`` that ``h`` is computed from."""

import numpy as np
import pytest

from nbqat.nn.layers.lstm import lstm_step


def _reference(xg, hh, c_prev):
    d = c_prev.shape[1]
    t = np.tanh(xg + hh)
    half = xg.dtype.type(0.5)
    i, f = half + half * t[:, :d], half + half * t[:, d : 2 * d]
    g, o = t[:, 2 * d : 3 * d], half + half * t[:, 3 * d :]
    c = f * c_prev + i * g
    tc = np.tanh(c)
    return np.concatenate([i, f, g, o], axis=1), c, tc, o * tc, o


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("nb, d", [(64, 16), (3, 5), (1, 1)])
def test_lstm_step_bit_for_bit(rng, dtype, nb, d):
    xg = rng.normal(size=(nb, 4 * d)).astype(dtype) * 3
    hh = rng.normal(size=(nb, 4 * d)).astype(dtype)
    c_prev = rng.normal(size=(nb, d)).astype(dtype)
    xg[0, 0] = np.nan  # NaN, Inf and a signed zero go through as NumPy's ops take them
    hh[0, 3 * d] = np.inf
    c_prev[-1, -1] = -0.0
    ref = _reference(xg, hh, c_prev)
    gates, o = np.empty_like(xg), np.full((nb, d), 7, dtype)
    c, tc, h = (np.empty_like(c_prev) for _ in range(3))
    lstm_step(xg, hh.copy(), c_prev, gates, c, tc, h, o)
    for got, want in zip((gates, c, tc, h, o), ref):
        np.testing.assert_array_equal(got.view(f"u{got.itemsize}"), want.view(f"u{got.itemsize}"))
