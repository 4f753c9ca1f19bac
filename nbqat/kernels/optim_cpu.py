"""CPU kernels for the fused optimizer updates (SGD with momentum, Adam, AdamW) over flat buffers.

One parallel elementwise pass per step updates parameters and optimizer state in place. The
arithmetic reproduces torch 2.13's single-tensor (``foreach=False``) CPU update operation by
operation in the parameters' dtype, including where torch's vectorised kernels fuse a multiply
and an add into one rounding (``add(alpha=)``, ``lerp``, ``addcmul``): those are explicit fused
multiply-adds here (:func:`fma`, ``llvm.fma``). Scalars (``lr``, betas, ...) arrive already cast to
the parameters' dtype, so float32 stays float32. ``gs`` (the clipping coefficient, ``grad_scale``)
multiplies each gradient first, exactly like ``clip_grads_with_norm_`` before ``step``.
"""

from __future__ import annotations

import math

from llvmlite import ir
from numba import prange, types
from numba.extending import intrinsic

from nbqat._jit import cpu_kernel


@intrinsic
def fma(typingctx, a, b, c):
    """``a * b + c`` with one rounding (``llvm.fma``), for float32 or float64 scalars."""
    if not (isinstance(a, types.Float) and a == b and b == c):
        return None
    sig = a(a, b, c)

    def codegen(context, builder, signature, args):
        ty = context.get_value_type(signature.return_type)
        fnty = ir.FunctionType(ty, [ty, ty, ty])
        fn = builder.module.declare_intrinsic("llvm.fma", [ty], fnty)
        return builder.call(fn, args)

    return sig, codegen


@cpu_kernel(parallel=False, inline="always")
def lerp(a, b, w, one_minus_w):
    """torch's ``lerp(a, b, w)`` of one element as ATen's vectorised kernel computes it:
    ``fma(w, b - a, a)`` for ``|w| < 0.5``, else ``fma(-(b - a), one_minus_w, b)``
    (``one_minus_w``: ``1 - w`` rounded to the dtype)."""
    d = b - a
    if abs(w) < 0.5:
        return fma(w, d, a)
    return fma(-d, one_minus_w, b)


@cpu_kernel(parallel=True)
def lerp_(a, b, w, one_minus_w):
    """In place ``a.lerp_(b, w)`` (torch) of two (n,) contiguous arrays of one float dtype;
    ``w`` and ``one_minus_w`` (``1 - w``) scalars of that dtype (see :func:`lerp`)."""
    for i in prange(a.size):
        a[i] = lerp(a[i], b[i], w, one_minus_w)


@cpu_kernel(parallel=True)
def sgd_step(p, g, buf, gs, lr_neg, momentum, one_minus_damp, wd, nesterov, first, scale):
    """In-place SGD step (torch ``_single_tensor_sgd``).

    Parameters
    ----------
    p, g, buf : (n,) float32 or float64, contiguous: parameters (updated), gradients (read),
        momentum buffer (updated when ``momentum != 0``).
    gs : gradient scale (``scale`` True: ``g * gs`` first).
    lr_neg : ``-lr``; momentum, one_minus_damp (``1 - dampening``), wd: torch's hyper-parameters,
        all of ``p``'s dtype.
    nesterov, first, scale : bool; ``first``: the momentum buffer is initialised to the gradient.
    """
    for i in prange(p.size):
        gi = g[i]
        if scale:
            gi = gi * gs
        if wd != 0:
            gi = fma(wd, p[i], gi)  # grad.add(param, alpha=wd)
        if momentum != 0:
            if first:
                b = gi  # buf = grad.clone()
            else:
                b = fma(one_minus_damp, gi, buf[i] * momentum)  # buf.mul_(m).add_(g, alpha=1-d)
            buf[i] = b
            if nesterov:
                gi = fma(momentum, b, gi)  # grad.add(buf, alpha=momentum)
            else:
                gi = b
        p[i] = fma(lr_neg, gi, p[i])  # param.add_(grad, alpha=-lr)


@cpu_kernel(parallel=True)
def adam_step(p, g, m, v, gs, w1, one_minus_w1, beta2, one_minus_beta2, wd, decay, bc2_sqrt, eps,
              step_neg, decoupled, scale):  # fmt: skip
    """In-place Adam / AdamW step (torch ``_single_tensor_adam``, amsgrad=False).

    Parameters
    ----------
    p, g, m, v : (n,) float32 or float64, contiguous: parameters, gradients (read), first and
        second moments (``exp_avg``, ``exp_avg_sq``).
    gs : gradient scale (applied when ``scale``).
    w1 : ``1 - beta1`` (the lerp weight); one_minus_w1: ``1 - w1`` in the dtype (torch's lerp).
    beta2, one_minus_beta2 : ``beta2`` and ``1 - beta2``.
    wd : L2 weight decay (Adam, ``decoupled`` False); decay: ``1 - lr * wd`` (AdamW).
    bc2_sqrt : ``sqrt(1 - beta2**step)``; eps; step_neg: ``-lr / (1 - beta1**step)``.
    All scalars of ``p``'s dtype.
    """
    for i in prange(p.size):
        gi = g[i]
        if scale:
            gi = gi * gs
        pi = p[i]
        if decoupled:
            pi = pi * decay  # param.mul_(1 - lr * wd)
        elif wd != 0:
            gi = fma(wd, pi, gi)  # grad.add(param, alpha=wd)
        mi = lerp(m[i], gi, w1, one_minus_w1)  # exp_avg.lerp_(grad, 1 - beta1)
        vi = fma(one_minus_beta2 * gi, gi, v[i] * beta2)  # v.mul_(b2).addcmul_(g, g, 1 - b2)
        m[i] = mi
        v[i] = vi
        denom = math.sqrt(vi) / bc2_sqrt + eps
        p[i] = pi + (step_neg * mi) / denom  # param.addcdiv_(exp_avg, denom, value=-step_size)
