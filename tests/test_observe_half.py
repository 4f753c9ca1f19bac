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


def _key_extremes(bits32):
    """NumPy oracle: (min, max) order key of int32 bit patterns (the module's formula)."""
    k = bits32 ^ ((bits32 >> 31) & np.int32(0x7FFFFFFF))
    return int(k.min()), int(k.max())


@pytest.mark.parametrize("width", [16, 32])
@pytest.mark.parametrize("kind", ["any", "non-negative", "negative", "zeros"])
def test_row_keys_three_reductions_equal_the_key_formula(rng, width, kind):
    # row_keys reduces signed min/max and unsigned max of the raw bits, never the keys: the
    # keys it derives must be the key formula's extremes for every sign mix, NaN and -0.0
    dt, ut = (np.int16, np.uint16) if width == 16 else (np.int32, np.uint32)
    hi = 1 << width
    for n in (1, 2, 7, 64, 1000):
        raw = rng.integers(0, hi, n, dtype=np.uint64).astype(ut)
        if kind == "non-negative":
            raw &= ut(hi // 2 - 1)
        elif kind == "negative":
            raw |= ut(hi // 2)
        elif kind == "zeros":
            raw = rng.choice(np.array([0, hi // 2], np.uint64), n).astype(ut)  # +0.0 and -0.0
        b = raw.view(dt)
        wide = b.astype(np.int32) << (32 - width)
        for start, stop in ((0, n), (n // 3, n), (0, 0)):
            got = K.row_keys(b, start, stop, K.KEY_POS_INF, K.KEY_NEG_INF)
            want = (
                _key_extremes(wide[start:stop])
                if stop > start
                else (int(K.KEY_POS_INF), int(K.KEY_NEG_INF))
            )
            assert (int(got[0]), int(got[1])) == want
            if stop > start:  # running keys fold in
                run = K.row_keys(b, start, stop, np.int32(want[0] + 1), np.int32(want[1] - 1))
                assert (int(run[0]), int(run[1])) == want
