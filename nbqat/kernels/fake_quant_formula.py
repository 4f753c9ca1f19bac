"""The scalar formulas of fake quantization, written once for every compile target.

Each function here is plain Python compiled twice, minitorch's way: for the CPU kernels with
``njit(inline="always")`` (through :func:`nbqat._jit.cpu_kernel`, so a kernel's on-disk cache is
keyed on this file too, see :class:`nbqat._jit.SourceClosureCache`), and for the CUDA kernels
with ``cuda.jit(device=True)`` (:func:`nbqat._cuda.device_function` on ``.py_func``, the calls
between them rebound to their device twins, and ``rint`` (``numpy.rint``, which CUDA device code
lacks) to :func:`nbqat._cuda.rint`: libdevice ``rintf`` / ``rint`` under the compiler, the same
round half to even). The kernels of :mod:`nbqat.kernels.fake_quant_cpu`,
:mod:`~nbqat.kernels.fake_quant_cuda`, :mod:`~nbqat.kernels.qat_cpu` and
:mod:`~nbqat.kernels.int8_cpu` only loop and store; the arithmetic is here.

All arguments are scalars of one float dtype ``T`` (float32, or float64 for float64 data), so
nothing widens (no fastmath: this is the rounding path). The order of operations is PyTorch's
(``aten/src/ATen/native/quantized/cpu/kernels/QuantizedOpKernels.cpp``): multiply by the float32
reciprocal ``inv = 1 / scale``, round half to even, THEN add the zero point; the STE mask is taken
on the unclamped rounded value; clamp in float (NaN -> ``qmin``); ``(q - zp) * scale``.
"""

from __future__ import annotations

import numpy as np
from numpy import rint  # by name: nbqat._cuda.device_function rebinds it to the device's rint

from nbqat._jit import cpu_kernel

_inline = cpu_kernel(parallel=False, inline="always")


@_inline
def quantize_code(xi, inv, z, qmin, qmax):  # pragma: no cover
    """``(r, q)``: the rounded value ``r = rint(xi * inv) + z`` (round half to even, then add the
    zero point) and its clamp ``q = min(max(r, qmin), qmax)`` (``fmax``/``fmin``: NaN -> qmin).

    ``q`` is the integer code held in ``T`` (exact: ``|q| <= 2**24``)."""
    r = rint(xi * inv) + z
    q = r if r > qmin else qmin
    q = q if q < qmax else qmax
    return r, q


@_inline
def fake_quant_elem(xi, s, inv, z, qmin, qmax):  # pragma: no cover
    """``(y, mask)`` of one element: ``y = (q - z) * s`` with ``q`` of :func:`quantize_code`,
    ``mask = qmin <= r <= qmax`` on the unclamped ``r`` (False for NaN and +-Inf)."""
    r, q = quantize_code(xi, inv, z, qmin, qmax)
    return (q - z) * s, (qmin <= r) & (r <= qmax)


@_inline
def ste_elem(g, m, one, zero):  # pragma: no cover
    """The straight-through estimator ``g * mask`` as a multiply (``NaN * 0`` stays NaN, like
    torch's ``dY * mask``); ``one`` and ``zero`` are 1 and 0 of ``g``'s dtype."""
    return g * (one if m else zero)


@_inline
def lsq_terms(x, grad_y, i, s, iv, z, qmin, qmax, gf):  # pragma: no cover
    """Element ``i``'s LSQ gradients ``(dx, ds, dz)`` in ``x``'s dtype.

    torch's ``_fake_quantize_grad_learnable_tensor_kernel`` arithmetic, with two deliberate
    choices: the rounding is the forward's (:func:`quantize_code`; torch adds the zero point
    first), and the in-range difference ``(xq - z) * s - x`` is evaluated exactly in float64 and
    rounded once, which is what torch's FMA-contracted x86 build computes. NaN ``x`` counts as
    below the range (the forward maps it to qmin). Esser et al., "Learned Step Size
    Quantization", ICLR 2020, eq. 3.
    """
    xi = x[i]
    gi = grad_y[i]
    one = s / s  # exactly 1 in x's dtype (s finite, > 0)
    zero = z - z  # exactly +0 (z finite)
    xq, _ = quantize_code(xi, iv, z, qmin, qmax)
    if xq >= qmin and xq <= qmax:
        d = x.dtype.type(np.float64(xq - z) * np.float64(s) - np.float64(xi))
        return gi * one, ((gi * d) * iv) * gf, zero
    dz = ((-gi) * s) * gf
    if xq > qmax:
        return gi * zero, (gi * (qmax - z)) * gf, dz
    return gi * zero, (gi * (qmin - z)) * gf, dz


@_inline
def min_nan(a, b):  # pragma: no cover
    """``numpy.minimum`` / ``torch.min`` of two scalars: NaN if either is NaN."""
    return a if (a < b or a != a) else b


@_inline
def max_nan(a, b):  # pragma: no cover
    """``numpy.maximum`` / ``torch.max`` of two scalars: NaN if either is NaN."""
    return a if (a > b or a != a) else b


@_inline
def scale_ok(s):  # pragma: no cover
    """Whether ``s`` (float32) is a usable scale: finite, > 0 and with a finite float32
    reciprocal (so not below about 2.9e-39). The one definition of the rule:
    :mod:`nbqat.quantization._validate_qparams` raises where it is False, before compiled code runs,
    and the
    fused kernels check the qparams they compute themselves with it."""
    if not (s > 0 and np.isfinite(s)):  # NaN, 0 (no division by zero), negative, +Inf
        return False
    return np.isfinite(np.float32(1.0) / s)


@_inline
def qparams_ok(s, z, qmin, qmax):  # pragma: no cover
    """:func:`scale_ok` of ``s`` and the zero point ``z`` inside ``[qmin, qmax]``: what
    :func:`nbqat.quantization._validate_qparams.check_scale` / ``check_zero_point`` accept for a
    range
    that is itself valid."""
    return scale_ok(s) and qmin <= z and z <= qmax
