"""float16 observer statistics come from the half bits themselves (no float32 copy): they must
equal those of ``x.astype(float32)`` bit for bit, NaN/Inf/-0 included."""

from __future__ import annotations

import numpy as np
import pytest

from nbqat.kernels import observe_cpu as K
from nbqat.quantization import _observer_stats as S


def _same(a, b):
    for u, v in zip(a, b, strict=True):
        assert u.dtype == v.dtype and u.tobytes() == v.tobytes()


def _all_halves(rng, reps=1):
    """Every float16 bit pattern (NaNs, Infs, -0, subnormals), shuffled."""
    bits = np.tile(np.arange(1 << 16, dtype=np.uint16), reps)
    return rng.permutation(bits).view(np.float16)


@pytest.mark.parametrize("finite", [False, True])
def test_half_per_tensor_matches_float32(rng, finite):
    x = _all_halves(rng, reps=3)  # 3 * 2^16 elements: several chunks of the threaded kernel
    if finite:
        x = x[np.isfinite(x)]
    _same(S.stats_cpu_tensor(x), S.stats_cpu_tensor(x.astype(np.float32)))
    kmin, kmax = K.minmax_keys_1d(x.view(np.int16))  # the threaded kernel, whatever the size
    if finite:  # (with NaN/Inf the keys only flag the slow path)
        _same((S.decode_half([kmin]), S.decode_half([kmax])), S.stats_cpu_tensor(x)[:2])
    else:
        assert kmin <= K.KEY_NEG_INF_H or kmax >= K.KEY_POS_INF_H


@pytest.mark.parametrize(
    "shape_axis",
    [((256, 256), 0), ((256, 256), 1), ((64, 4, 256), 1), ((1024, 64), 1), ((16, 4096), 0)],
)
def test_half_per_channel_matches_float32(rng, shape_axis):
    shape, axis = shape_axis
    x = _all_halves(rng).reshape(shape)
    x[: shape[0] // 4] = -np.abs(x[: shape[0] // 4])  # channels or rows without a positive value
    for y in (x, np.asfortranarray(x)):
        _same(S.stats_cpu_channel(y, axis), S.stats_cpu_channel(y.astype(np.float32), axis))
    fin = np.where(np.isfinite(x), x, np.float16(-3.5))
    _same(S.stats_cpu_channel(fin, axis), S.stats_cpu_channel(fin.astype(np.float32), axis))


@pytest.mark.parametrize(
    "values", [[np.nan] * 5, [-0.0, -0.0], [-0.0, 0.0], [np.inf, -np.inf], [-7.0], [-np.inf, 1.0]]
)
def test_half_edge_batches(values):
    x = np.array(values, np.float16)
    _same(S.stats_cpu_tensor(x), S.stats_cpu_tensor(x.astype(np.float32)))
    y = x.reshape(1, -1)
    _same(S.stats_cpu_channel(y, 0), S.stats_cpu_channel(y.astype(np.float32), 0))
