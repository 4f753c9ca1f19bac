"""CPU kernel of :class:`nbqat.nn.Dropout`: NumPy's random stream, the mask and ``x * mask`` in
one compiled call.

The mask is NumPy's, bit for bit: ``default_rng(seed).random(shape, dtype) >= p``, i.e.
``Generator(PCG64(SeedSequence(seed)))``. :func:`seed_sequence_pcg64` seeds as NumPy does
(``SeedSequence``'s entropy pool and ``generate_state``, ``numpy/random/bit_generator.pyx``, then
PCG64's ``srandom``); PCG64 steps its 128-bit LCG ``state = state * M + inc`` (one native 128-bit
multiply-add, :func:`pcg64_step`) and outputs ``rotr64(hi ^ lo, hi >> 58)`` (XSL-RR; O'Neill
2014, ``numpy/random/src/pcg64/pcg64.h``). The uniforms are NumPy's: float32 ``(next_uint32 >> 8)
* 2**-24``, each 64-bit draw serving two uint32s (its low half first), and float64
``(next_uint64 >> 11) * 2**-53`` (``numpy/random/src/distributions/distributions.c``). The
draws NumPy makes for the rows of other ranks (data-parallel dropout draws the global batch's
mask) are jumped over (:func:`pcg64_jump`, NumPy's ``PCG64.advance``). The tests check each
piece against NumPy's own generator.

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

__all__ = [
    "PCG64_MULTIPLIER",
    "dropout_forward",
    "mul_add_u128",
    "pcg64_jump",
    "pcg64_step",
    "seed_sequence_pcg64",
]

#: PCG64's 128-bit LCG multiplier (``PCG_DEFAULT_MULTIPLIER_128``), as (high, low) words.
PCG64_MULTIPLIER = (2549297995355413924, 4865540595714422341)


@intrinsic
def mul_add_u128(typingctx, a_hi, a_lo, b_hi, b_lo, c_hi, c_lo):
    """``a * b + c`` modulo 2**128 on (high, low) uint64 words, as (high, low): one i128
    multiply-add (LLVM's ``mul`` / ``add`` on ``i128``)."""
    u64 = types.uint64
    if not all(a == u64 for a in (a_hi, a_lo, b_hi, b_lo, c_hi, c_lo)):
        return None
    sig = types.UniTuple(u64, 2)(u64, u64, u64, u64, u64, u64)

    def codegen(context, builder, signature, args):
        i64, i128 = ir.IntType(64), ir.IntType(128)
        sixty_four = ir.Constant(i128, 64)

        def join(h, l):
            return builder.or_(
                builder.shl(builder.zext(h, i128), sixty_four), builder.zext(l, i128)
            )

        a, b, c = (join(args[k], args[k + 1]) for k in (0, 2, 4))
        s = builder.add(builder.mul(a, b), c)
        words = [builder.trunc(builder.lshr(s, sixty_four), i64), builder.trunc(s, i64)]
        return context.make_tuple(builder, signature.return_type, words)

    return sig, codegen


_M_HI, _M_LO = np.uint64(PCG64_MULTIPLIER[0]), np.uint64(PCG64_MULTIPLIER[1])


@cpu_kernel(parallel=False, inline="always")
def pcg64_step(hi, lo, inc_hi, inc_lo):  # pragma: no cover
    """One step of PCG64's LCG: ``(hi, lo) * PCG64_MULTIPLIER + (inc_hi, inc_lo)`` modulo
    2**128, as (high, low) uint64 words."""
    return mul_add_u128(hi, lo, _M_HI, _M_LO, inc_hi, inc_lo)


@cpu_kernel(parallel=False, inline="always")
def pcg64_jump(n, inc_hi, inc_lo):  # pragma: no cover
    """``(A, C)`` as (a_hi, a_lo, c_hi, c_lo) with ``state * A + C`` equal to ``n`` LCG steps
    (Brown's jump-ahead by squaring, O(log n): PCG's ``pcg_advance_lcg_128``)."""
    zero, one = np.uint64(0), np.uint64(1)
    a_hi, a_lo, c_hi, c_lo = zero, one, zero, zero  # the identity map
    m_hi, m_lo, k_hi, k_lo = _M_HI, _M_LO, inc_hi, inc_lo  # one step
    d = np.uint64(n)
    while d > zero:
        if d & one:  # compose: s -> (s * A + C) * M + K
            a_hi, a_lo = mul_add_u128(a_hi, a_lo, m_hi, m_lo, zero, zero)
            c_hi, c_lo = mul_add_u128(c_hi, c_lo, m_hi, m_lo, k_hi, k_lo)
        p_lo = m_lo + one  # the map squared: M' = M * M, K' = (M + 1) * K
        p_hi = m_hi + (one if p_lo == zero else zero)
        k_hi, k_lo = mul_add_u128(p_hi, p_lo, k_hi, k_lo, zero, zero)
        m_hi, m_lo = mul_add_u128(m_hi, m_lo, m_hi, m_lo, zero, zero)
        d = d >> one
    return a_hi, a_lo, c_hi, c_lo


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


#: Draws per chunk of :func:`dropout_forward` (a multiple of :data:`_LANES`; 2 KiB).
_CHUNK = 256
#: Interleaved LCG lanes: each 128-bit multiply-add waits on the previous one of its own stream
#: (about 8 cycles), four independent lanes overlap them.
_LANES = 4


@cpu_kernel(parallel=False, inline="always")
def _xsl_rr(hi, lo):  # pragma: no cover
    """PCG64's output of a state: ``rotr64(hi ^ lo, hi >> 58)`` (XSL-RR)."""
    rot = hi >> np.uint64(58)
    v = hi ^ lo
    return (v >> rot) | (v << ((np.uint64(64) - rot) & np.uint64(63)))


@cpu_kernel(parallel=False, inline="always")
def _pcg64_fill(hi, lo, inc_hi, inc_lo, jump, out, c):  # pragma: no cover
    """``out[:c]`` = the next ``c`` outputs of the stream at state ``(hi, lo)``, made by
    :data:`_LANES` lanes (lane u holds the states u + 1, u + 1 + L, ...; ``jump`` is
    :func:`pcg64_jump` of L steps); returns the state after the last draw."""
    a_hi, a_lo, c_hi, c_lo = jump
    q = c // _LANES
    if q > 0:
        h0, l0 = pcg64_step(hi, lo, inc_hi, inc_lo)
        h1, l1 = pcg64_step(h0, l0, inc_hi, inc_lo)
        h2, l2 = pcg64_step(h1, l1, inc_hi, inc_lo)
        h3, l3 = pcg64_step(h2, l2, inc_hi, inc_lo)
        for i in range(q):
            k = i * _LANES
            out[k] = _xsl_rr(h0, l0)
            out[k + 1] = _xsl_rr(h1, l1)
            out[k + 2] = _xsl_rr(h2, l2)
            out[k + 3] = _xsl_rr(h3, l3)
            hi, lo = h3, l3
            h0, l0 = mul_add_u128(h0, l0, a_hi, a_lo, c_hi, c_lo)
            h1, l1 = mul_add_u128(h1, l1, a_hi, a_lo, c_hi, c_lo)
            h2, l2 = mul_add_u128(h2, l2, a_hi, a_lo, c_hi, c_lo)
            h3, l3 = mul_add_u128(h3, l3, a_hi, a_lo, c_hi, c_lo)
    for k in range(q * _LANES, c):
        hi, lo = pcg64_step(hi, lo, inc_hi, inc_lo)
        out[k] = _xsl_rr(hi, lo)
    return hi, lo


@cpu_kernel(parallel=False, inline="always")
def _keep(bits, thr, scale, zero):  # pragma: no cover
    """The mask value of a uniform's integer bits: ``bits * 2**-b >= p`` is ``bits >= thr``."""
    return scale if bits >= thr else zero


@cpu_kernel(parallel=False)
def dropout_forward(x, y, mask, p, scale, entropy, skip):  # pragma: no cover
    """``mask = (u >= p) * scale`` and ``y = x * mask`` for the uniforms ``u`` of NumPy's
    ``default_rng(seed).random(..., dtype=x.dtype)`` after ``skip`` of them.

    Parameters
    ----------
    x : (n,) float32 or float64, contiguous
    y, mask : (n,) of ``x``'s dtype (outputs)
    p, scale : scalars of ``x``'s dtype
        The drop probability (``0 <= p < 1``) and ``1 / (1 - p)``.
    entropy : (w,) uint32
        The seed's words (:func:`seed_sequence_pcg64`).
    skip : int
        Uniforms drawn and dropped first (other ranks' rows): jumped over in O(log skip).

    Notes
    -----
    A uniform is ``bits * 2**-b`` with ``bits`` the draw's top 24 (float32) or 53 (float64)
    bits, both factors exact, so ``u >= p`` is the integer test ``bits >= ceil(p * 2**b)``
    (``p * 2**b`` is exact in float64). The draws come in chunks of :data:`_CHUNK` from
    :data:`_LANES` interleaved lanes, then one pass per chunk turns them into mask values;
    ``x * mask`` is a last pass that vectorises.
    """
    T = x.dtype.type
    n = x.size
    zero = scale * T(0.0)
    f32 = x.itemsize == 4
    per = 2 if f32 else 1  # uniforms per 64-bit draw: float32 takes the low half, then the high
    width = 24 if f32 else 53
    thr = np.uint64(np.ceil(np.float64(p) * np.float64(2.0) ** width))
    low24, sh8, sh40, sh11 = np.uint64(0xFFFFFF), np.uint64(8), np.uint64(40), np.uint64(11)
    hi, lo, inc_hi, inc_lo = seed_sequence_pcg64(entropy)
    first, off = skip // per, skip % per  # draws skipped whole; uniforms skipped of the next
    a_hi, a_lo, c_hi, c_lo = pcg64_jump(first, inc_hi, inc_lo)
    hi, lo = mul_add_u128(hi, lo, a_hi, a_lo, c_hi, c_lo)
    nd = (off + n + per - 1) // per  # the draws that hold our uniforms
    jump = pcg64_jump(_LANES, inc_hi, inc_lo)
    buf = np.empty(_CHUNK, np.uint64)
    for d0 in range(0, nd, _CHUNK):
        c = min(_CHUNK, nd - d0)
        hi, lo = _pcg64_fill(hi, lo, inc_hi, inc_lo, jump, buf, c)
        if not f32:
            seg = mask[d0 : d0 + c]
            for i in range(c):
                seg[i] = _keep(buf[i] >> sh11, thr, scale, zero)
            continue
        # draw d holds elements 2d - off (low half) and 2d + 1 - off (high half); only the
        # first draw (off = 1) and the last (n + off odd) hold fewer than two of ours
        i0 = 1 if d0 == 0 else 0
        i1 = c - 1 if d0 + c == nd else c
        if i1 > i0:  # (views, so that the indices are known non-negative: it vectorises)
            seg = mask[2 * (d0 + i0) - off : 2 * (d0 + i1) - off]
            src = buf[i0:i1]
            for i in range(i1 - i0):
                r = src[i]
                seg[2 * i] = _keep((r >> sh8) & low24, thr, scale, zero)
                seg[2 * i + 1] = _keep(r >> sh40, thr, scale, zero)
        for e in range(2):  # the edge draws (the first, the last; once if c = 1), bounded
            i = 0 if e == 0 else c - 1
            if (e == 1 and c == 1) or i0 <= i < i1:
                continue
            r = buf[i]
            k = 2 * (d0 + i) - off
            if 0 <= k < n:
                mask[k] = _keep((r >> sh8) & low24, thr, scale, zero)
            if 0 <= k + 1 < n:
                mask[k + 1] = _keep(r >> sh40, thr, scale, zero)
    for k in range(n):
        y[k] = x[k] * mask[k]
