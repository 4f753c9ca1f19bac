"""The compiled dropout pass against NumPy's own generator (the oracle): SeedSequence + PCG64
seeding, the float32 / float64 uniform streams, skipped draws (data-parallel rows) and the mask
applied to NaN, Inf and signed zeros."""

from __future__ import annotations

import numpy as np
import pytest

from nbqat.kernels.dropout_cpu import dropout_forward, pcg64_jump, seed_sequence_pcg64
from nbqat.nn import Dropout

WORD = (1 << 64) - 1


def _words(seed):
    """NumPy's own assembly of a seed's uint32 words (private, but the oracle itself)."""
    from numpy.random.bit_generator import _coerce_to_uint32_array

    return _coerce_to_uint32_array(list(seed))


@pytest.mark.parametrize(
    "seed",
    [[0], [0, 0, 0, 0], [7, 1, 0, 3], [2**32, 5], [2**100 + 17, 1, 2], list(range(9))],
)
def test_seed_sequence_pcg64_matches_numpy(seed):
    st = np.random.PCG64(np.random.SeedSequence(seed)).state["state"]
    want = (st["state"] >> 64, st["state"] & WORD, st["inc"] >> 64, st["inc"] & WORD)
    assert tuple(int(w) for w in seed_sequence_pcg64(_words(seed))) == want


def test_seed_sequence_pcg64_random_seeds():
    rng = np.random.default_rng(11)
    for _ in range(100):
        seed = [int(v) for v in rng.integers(0, 2**31, size=int(rng.integers(1, 7)))]
        st = np.random.PCG64(np.random.SeedSequence(seed)).state["state"]
        got = seed_sequence_pcg64(_words(seed))
        assert (int(got[0]) << 64 | int(got[1])) == st["state"], seed
        assert (int(got[2]) << 64 | int(got[3])) == st["inc"], seed


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
# chunks of 256 draws: n around 512 / 1024 uniforms (float32) puts the edges on chunk ends
@pytest.mark.parametrize(
    "n, skip",
    [(0, 0), (0, 3), (1, 0), (1, 1), (2, 1), (7, 0), (8, 3), (1001, 4), (511, 1), (512, 1),
     (513, 0), (1024, 3), (1025, 2), (3, 300_001)],
)  # fmt: skip
def test_dropout_forward_matches_numpy_stream(dtype, n, skip):
    seed = [3, 1, 7, 2]
    p = dtype(0.3)
    scale = dtype(1.0) / (dtype(1.0) - p)
    x = np.random.default_rng(1).normal(size=n).astype(dtype)
    x[: min(n, 4)] = np.array([np.nan, np.inf, -0.0, -np.inf], dtype)[: min(n, 4)]
    u = np.random.default_rng(seed).random(n + skip, dtype=dtype)[skip:]
    mask_ref = (u >= p).astype(dtype) * scale
    y, mask = np.full(n, 5, dtype), np.full(n, 5, dtype)
    dropout_forward(x, y, mask, p, scale, _words(seed), skip)
    np.testing.assert_array_equal(mask, mask_ref)
    with np.errstate(invalid="ignore"):  # Inf * 0
        y_ref = x * mask_ref
    np.testing.assert_array_equal(y, y_ref)  # NaN where NumPy's product is NaN
    assert np.array_equal(np.signbit(y), np.signbit(y_ref))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_dropout_threshold_at_a_drawn_uniform(dtype):
    """``u >= p`` decided exactly where p is a drawn uniform or its neighbours (the kernel
    compares integer bits with ``ceil(p * 2**b)``)."""
    seed = [4, 4]
    u = np.random.default_rng(seed).random(9, dtype=dtype)
    for k in range(9):
        for p in (u[k], np.nextafter(u[k], dtype(1)), np.nextafter(u[k], dtype(0))):
            scale = dtype(1.0) / (dtype(1.0) - p)
            mask = np.empty(9, dtype)
            dropout_forward(np.ones(9, dtype), np.empty(9, dtype), mask, p, scale, _words(seed), 0)
            np.testing.assert_array_equal(mask, (u >= p).astype(dtype) * scale)


@pytest.mark.parametrize("n", [0, 1, 2, 3, 4, 5, 255, 2**40 + 3, 2**64 - 1])
def test_pcg64_jump_is_numpys_advance(n):
    """Jumping n steps from a seeded state lands where NumPy's ``PCG64.advance(n)`` does."""
    bg = np.random.PCG64(np.random.SeedSequence([5, 2]))
    hi, lo, inc_hi, inc_lo = (int(w) for w in seed_sequence_pcg64(_words([5, 2])))
    a_hi, a_lo, c_hi, c_lo = (int(w) for w in pcg64_jump(np.uint64(n), np.uint64(inc_hi),
                                                             np.uint64(inc_lo)))  # fmt: skip
    got = ((hi << 64 | lo) * (a_hi << 64 | a_lo) + (c_hi << 64 | c_lo)) % 2**128
    assert got == bg.advance(n).state["state"]["state"]


def test_dropout_rows_of_a_rank_are_the_global_rows():
    """A data-parallel rank's mask: rows start:stop of the global batch's (NumPy's draw)."""
    x = np.random.default_rng(2).normal(size=(12, 5, 3)).astype(np.float32)
    full = Dropout(0.4)
    full.training, full.seed, full.stream = True, (9, 1, 4), 2
    y_full = full.forward(x)
    keep = np.random.default_rng([9, 1, 4, 2]).random(x.shape, dtype=np.float32) >= np.float32(0.4)
    np.testing.assert_array_equal(full.mask, keep * (np.float32(1) / np.float32(0.6)))
    for a, b in ((0, 1), (1, 3), (3, 4)):  # 4 batch rows, 3 rows of x per batch row
        d = Dropout(0.4)
        d.training, d.seed, d.stream, d.rows = True, (9, 1, 4), 2, (4, a, b)
        np.testing.assert_array_equal(d.forward(x[3 * a : 3 * b]), y_full[3 * a : 3 * b])


def test_seed_words_are_numpys():
    from nbqat.nn.layers.dropout import _seed_words

    for seed in ([0], [0, 0], [1, 2**32, 2**64 + 5, 0], [2**31 - 1, 7]):
        np.testing.assert_array_equal(_seed_words(seed), _words(seed))


def test_dropout_bad_input():
    d = Dropout(0.2)
    d.training = True
    with pytest.raises(TypeError, match="float32 or float64"):
        d.forward(np.ones(4, np.float16))
    d.seed = (-1, 0)
    with pytest.raises(ValueError, match="non-negative"):
        d.forward(np.ones(4, np.float32))
    assert d.mask is None  # nothing written


def test_dropout_backward_refuses_a_gradient_of_another_shape():
    """A (C,) or (1, C) dy broadcast against a (B, C) mask into a (B, C) gradient (every row
    the one row's, silently); now a ValueError naming dy. The mask's shape gives dy * mask."""
    d = Dropout(0.5)
    d.training = True
    x = np.ones((3, 4))
    d.forward(x)
    for bad in (np.ones(4), np.ones((1, 4)), np.ones((4, 3))):
        with pytest.raises(ValueError, match=r"Dropout.backward: dy must have shape \(3, 4\)"):
            d.backward(bad)
    dy = np.arange(12.0).reshape(3, 4)
    np.testing.assert_array_equal(d.backward(dy), dy * d.mask)
