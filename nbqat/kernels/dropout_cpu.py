"""CPU kernel of :class:`nbqat.nn.Dropout`: NumPy's random stream, the mask and ``x * mask`` in
one compiled call.

The mask is NumPy's, bit for bit: ``default_rng(seed).random(shape, dtype) >= p``, i.e.
``Generator(PCG64(SeedSequence(seed)))``. :func:`seed_sequence_pcg64` seeds as NumPy does
(``SeedSequence``'s entropy pool and ``generate_state``, ``numpy/random/bit_generator.pyx``, then
PCG64's ``srandom``); PCG64 steps its 128-bit LCG ``state = state * M + inc`` (one native 128-bit
multiply-add, :func:`pcg64_step`) and outputs ``rotr64(hi ^ lo, hi >> 58)`` (XSL-RR; O'Neill
2014, ``numpy/random/src/pcg64/pcg64.h``). The uniforms are NumPy's: float32 ``(next_uint32 >> 8)
* 2**-24``, each 64-bit draw serving two uint32s (its low half first), and float64
``(next_uint64 >> 11) * 2**-53`` (``numpy/random/src/distributions/distributions.c``). Draws that
NumPy makes for the rows of other ranks (data-parallel dropout draws the global batch's mask) are
made and skipped here too. The tests check each piece against NumPy's own generator.

Why compiled: NumPy's seeding alone costs ~20 us a call, and its draw, compare, cast and two
products are five passes; a training step of the main job runs 33 dropout layers.

Serial, as the layer kernels (:mod:`nbqat.kernels.nn_cpu`): the stream is sequential and the
arrays are small.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import types
from numba.extending import intrinsic

from nbqat._jit import cpu_kernel

__all__ = ["PCG64_MULTIPLIER", "dropout_forward", "pcg64_step", "seed_sequence_pcg64"]

#: PCG64's 128-bit LCG multiplier (``PCG_DEFAULT_MULTIPLIER_128``), as (high, low) words.
PCG64_MULTIPLIER = (2549297995355413924, 4865540595714422341)


@intrinsic
def pcg64_step(typingctx, hi, lo, inc_hi, inc_lo):
    """``(hi, lo) * PCG64_MULTIPLIER + (inc_hi, inc_lo)`` modulo 2**128, as (high, low) uint64
    words: one i128 multiply-add (LLVM's ``mul`` / ``add`` on ``i128``)."""
    u64 = types.uint64
    if not all(a == u64 for a in (hi, lo, inc_hi, inc_lo)):
        return None
    sig = types.UniTuple(u64, 2)(u64, u64, u64, u64)

    def codegen(context, builder, signature, args):
        i64, i128 = ir.IntType(64), ir.IntType(128)
        sixty_four = ir.Constant(i128, 64)

        def join(h, l):
            return builder.or_(
                builder.shl(builder.zext(h, i128), sixty_four), builder.zext(l, i128)
            )

        m = ir.Constant(i128, (PCG64_MULTIPLIER[0] << 64) | PCG64_MULTIPLIER[1])
        s = builder.add(builder.mul(join(args[0], args[1]), m), join(args[2], args[3]))
        words = [builder.trunc(builder.lshr(s, sixty_four), i64), builder.trunc(s, i64)]
        return context.make_tuple(builder, signature.return_type, words)

    return sig, codegen


# SeedSequence's hash constants (numpy/random/bit_generator.pyx), uint32 arithmetic
_INIT_A, _MULT_A, _INIT_B, _MULT_B = 0x43B0D7E5, 0x931E8875, 0x8B51F9DD, 0x58F38DED
_MIX_MULT_L, _MIX_MULT_R = 0xCA01F9DD, 0x4973F715


@cpu_kernel(parallel=False, inline="always")
def _hashmix(value, hash_const):  # pragma: no cover
    """SeedSequence's ``hashmix``: ``(value', hash_const')``, modulo 2**32 (Numba widens uint32
    arithmetic to 64 bits: every result is narrowed again)."""
    value = np.uint32(value ^ hash_const)
    hash_const = np.uint32(hash_const * np.uint32(_MULT_A))
    value = np.uint32(value * hash_const)
    return np.uint32(value ^ (value >> np.uint32(16))), hash_const


@cpu_kernel(parallel=False, inline="always")
def _mix(x, y):  # pragma: no cover
    """SeedSequence's ``mix`` (uint32)."""
    r = np.uint32(np.uint32(np.uint32(_MIX_MULT_L) * x) - np.uint32(np.uint32(_MIX_MULT_R) * y))
    return np.uint32(r ^ (r >> np.uint32(16)))


@cpu_kernel(parallel=False)
def seed_sequence_pcg64(entropy):  # pragma: no cover
    """``PCG64(SeedSequence(entropy))``'s starting ``(hi, lo, inc_hi, inc_lo)`` (uint64 words).

    Parameters
    ----------
    entropy : (w,) uint32
        The seed's words, as NumPy assembles them (each non-negative int as its uint32 words,
        lowest first; 0 as one word).
    """
    pool = np.zeros(4, np.uint32)
    h = np.uint32(_INIT_A)
    for i in range(4):  # mix_entropy: the first words, then the hash run out
        w = entropy[i] if i < entropy.size else np.uint32(0)
        pool[i], h = _hashmix(w, h)
    for i_src in range(4):
        for i_dst in range(4):
            if i_src != i_dst:
                v, h = _hashmix(pool[i_src], h)
                pool[i_dst] = _mix(pool[i_dst], v)
    for i_src in range(4, entropy.size):
        for i_dst in range(4):
            v, h = _hashmix(entropy[i_src], h)
            pool[i_dst] = _mix(pool[i_dst], v)
    words = np.zeros(8, np.uint64)  # generate_state(4, np.uint64): 8 uint32s, little-endian
    hb = np.uint32(_INIT_B)
    for i in range(8):
        d = np.uint32(pool[i % 4] ^ hb)
        hb = np.uint32(hb * np.uint32(_MULT_B))
        d = np.uint32(d * hb)
        words[i] = np.uint64(np.uint32(d ^ (d >> np.uint32(16))))
    sh = np.uint64(32)
    seed_hi, seed_lo = words[1] << sh | words[0], words[3] << sh | words[2]
    inc_hi, inc_lo = words[5] << sh | words[4], words[7] << sh | words[6]
    # pcg_setseq_128_srandom_r: inc = seq << 1 | 1; state = 0; step; state += seed; step
    inc_hi = inc_hi << np.uint64(1) | inc_lo >> np.uint64(63)
    inc_lo = inc_lo << np.uint64(1) | np.uint64(1)
    hi, lo = pcg64_step(np.uint64(0), np.uint64(0), inc_hi, inc_lo)
    lo2 = lo + seed_lo
    hi = hi + seed_hi + (np.uint64(1) if lo2 < lo else np.uint64(0))
    hi, lo = pcg64_step(hi, lo2, inc_hi, inc_lo)
    return hi, lo, inc_hi, inc_lo


@cpu_kernel(parallel=False, inline="always")
def pcg64_next(hi, lo, inc_hi, inc_lo):  # pragma: no cover
    """One PCG64 draw: the stepped state and its 64-bit output ``rotr64(hi ^ lo, hi >> 58)``
    (XSL-RR), as ``(hi, lo, r)``."""
    hi, lo = pcg64_step(hi, lo, inc_hi, inc_lo)
    rot = hi >> np.uint64(58)
    v = hi ^ lo
    return hi, lo, (v >> rot) | (v << ((np.uint64(64) - rot) & np.uint64(63)))


@cpu_kernel(parallel=False)
def dropout_forward(x, y, mask, p, scale, entropy, skip):  # pragma: no cover
    """``mask = (u >= p) * scale`` and ``y = x * mask`` for the uniforms ``u`` of NumPy's
    ``default_rng(seed).random(..., dtype=x.dtype)`` after ``skip`` of them.

    Parameters
    ----------
    x : (n,) float32 or float64, contiguous
    y, mask : (n,) of ``x``'s dtype (outputs)
    p, scale : scalars of ``x``'s dtype
        The drop probability and ``1 / (1 - p)``.
    entropy : (w,) uint32
        The seed's words (:func:`seed_sequence_pcg64`).
    skip : int
        Uniforms drawn and dropped first (other ranks' rows).

    Notes
    -----
    The mask is written in a serial pass (the stream), ``x * mask`` in a second one that
    vectorises: one fused pass measured twice as slow.
    """
    T = x.dtype.type
    n = x.size
    zero = scale * T(0.0)
    hi, lo, inc_hi, inc_lo = seed_sequence_pcg64(entropy)
    if x.itemsize == 8:  # float64: one 64-bit draw a uniform
        two53 = T(1.0 / 9007199254740992.0)
        for _ in range(skip):
            hi, lo, r = pcg64_next(hi, lo, inc_hi, inc_lo)
        for k in range(n):
            hi, lo, r = pcg64_next(hi, lo, inc_hi, inc_lo)
            mask[k] = scale if T(np.int64(r >> np.uint64(11))) * two53 >= p else zero
    else:  # float32: a 64-bit draw serves two uniforms, its low half first
        two24, sh8, sh40 = T(1.0 / 16777216.0), np.uint64(8), np.uint64(40)
        low24 = np.uint64(0xFFFFFF)
        for _ in range(skip // 2):
            hi, lo, r = pcg64_next(hi, lo, inc_hi, inc_lo)
        k = 0
        if skip % 2 == 1 and n > 0:  # the skipped uniforms end on a low half: ours is its high
            hi, lo, r = pcg64_next(hi, lo, inc_hi, inc_lo)
            mask[0] = scale if T(np.int64(r >> sh40)) * two24 >= p else zero
            k = 1
        for j in range(k, n - 1, 2):
            hi, lo, r = pcg64_next(hi, lo, inc_hi, inc_lo)
            mask[j] = scale if T(np.int64((r >> sh8) & low24)) * two24 >= p else zero
            mask[j + 1] = scale if T(np.int64(r >> sh40)) * two24 >= p else zero
        if (n - k) % 2 == 1:
            hi, lo, r = pcg64_next(hi, lo, inc_hi, inc_lo)
            mask[n - 1] = scale if T(np.int64((r >> sh8) & low24)) * two24 >= p else zero
    for k in range(n):
        y[k] = x[k] * mask[k]
