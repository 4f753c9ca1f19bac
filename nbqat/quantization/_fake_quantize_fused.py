"""The fused fast path of :class:`nbqat.FakeQuantize` (the QAT model's hot path).

~130 quantizer calls per training step on small tensors: each forward here is ONE compiled call
(:func:`nbqat.kernels.qat_cpu.fq_tensor_fused` / ``fq_channel_fused``) that does the observer's
min/max pass, its update, the qparams and the fake quantization, with the same results and state,
bit for bit, as the public path, and without re-validating what the module guarantees itself
(its qparams are float32 > 0 with the zero point in range). Each function returns None -- with
nothing changed -- when the input or the state needs the public path (non-finite data or state,
qparams that fake quantization refuses, a custom observer); the caller then takes it. The
arithmetic is not written here nor in the kernels: both paths call
:mod:`nbqat.kernels.observer_formula` and :mod:`nbqat.kernels.fake_quant_formula`.

Nothing here writes to the quantizer or its observer: each function returns the new state and
:meth:`nbqat.FakeQuantize.forward` (``_forward_fused``) applies it, so the class owns its
state on both paths.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from nbqat import _jit
from nbqat.kernels import qat_cpu as _qk
from nbqat.quantization.observers import (
    MinMaxObserver,
    MovingAverageMinMaxObserver,
    MovingAveragePerChannelMinMaxObserver,
    PerChannelMinMaxObserver,
)

_F32 = np.float32
_DT32 = np.dtype(np.float32)
_DTBOOL = np.dtype(np.bool_)
_ONE = _F32(1.0)
#: Typed placeholders for the fused kernels' unused arguments (one compiled specialisation).
_DUMMY_F32 = np.zeros(1, _F32)
_DUMMY_BOOL = np.zeros(1, np.bool_)
_EMPTY_F32 = np.zeros(0, _F32)
_EMPTY_F32_3 = np.zeros((3, 0), _F32)
#: The fused kernels' observer settings when the observer is disabled (values unused).
_NO_OBSERVER = (False, _ONE, False, 0, 0, 0, _ONE)
_TENSOR_OBSERVERS = (MovingAverageMinMaxObserver, MinMaxObserver)
_CHANNEL_OBSERVERS = (MovingAveragePerChannelMinMaxObserver, PerChannelMinMaxObserver)
_MOVING = (MovingAverageMinMaxObserver, MovingAveragePerChannelMinMaxObserver)


def eligible(x: Any) -> bool:
    """Whether ``x`` may take the fused path: a C-contiguous float32 NumPy array with
    ``0 < x.size < PARALLEL_MIN`` (read at call time)."""
    return (
        type(x) is np.ndarray
        and x.dtype is _DT32
        and x.flags.c_contiguous
        and 0 < x.size < _jit.PARALLEL_MIN
    )


def _settings(obs: Any, allowed: tuple[type, ...]) -> tuple | None:
    """The fused kernels' observer settings ``(moving, averaging_constant, symmetric, symmetric
    zero point, quant_min, quant_max, eps)``, or None for an observer they do not reproduce."""
    cls = type(obs)
    if cls not in allowed:
        return None
    moving, symmetric = cls in _MOVING, obs.symmetric
    return (
        moving,
        _F32(obs.averaging_constant) if moving else _ONE,
        symmetric,
        obs.symmetric_zero_point() if symmetric else 0,
        obs.quant_min,
        obs.quant_max,
        obs.eps,
    )


def _outputs(fq: Any, x: np.ndarray) -> tuple[Any, Any, np.ndarray, np.ndarray]:
    """``(y, mask, y buffer, mask buffer)``: fresh outputs when fake quantization is on, else
    ``(x, None)`` and the kernels' dummies."""
    if fq.fake_quant_enabled:
        y = np.empty(x.shape, _F32)
        mask = np.empty(x.shape, np.bool_)
        return y, mask, y.reshape(-1), mask.reshape(-1)
    return x, None, _DUMMY_F32, _DUMMY_BOOL


def forward_tensor(fq: Any, x: np.ndarray, observe: bool) -> tuple | None:
    """Per-tensor fused forward of ``fq`` on an :func:`eligible` ``x``; ``observe`` False
    fake-quantizes with the current qparams.

    Returns
    -------
    (y, mask, new_state) or None
        ``mask`` None when fake quantization is off (``y`` is ``x``); ``new_state`` is
        ``(min_val, max_val, scale (1,) float32, zero_point (1,) int32)`` when ``observe``,
        else None. None: nothing was computed that the caller may keep (module docstring).
    """
    obs = fq.activation_post_process
    if observe:
        settings = _settings(obs, _TENSOR_OBSERVERS)
        if settings is None:
            return None
        old = (obs.min_val[()], obs.max_val[()])
    else:
        settings, old = _NO_OBSERVER, (_ONE, _ONE)
    y, mask, yb, mb = _outputs(fq, x)
    fake, qrange = fq.fake_quant_enabled, (fq.quant_min, fq.quant_max)
    s0, z0 = fq.scale[0], fq.zero_point[0]
    ok, mn, mx, s, z = _qk.fq_tensor_fused(
        x.reshape(-1), yb, mb, s0, z0, observe, fake, old, settings, qrange
    )
    if not ok:
        return None
    new = (mn, mx, np.array([s], _F32), np.array([z], np.int32)) if observe else None
    return y, mask, new


def forward_channel(fq: Any, x: np.ndarray, observe: bool) -> tuple | None:
    """Per-channel (channel axis first) fused forward, returning as :func:`forward_tensor`
    ((C,) new state); None also for another channel axis or a channel count the state does
    not have."""
    nd = x.ndim
    if nd == 0 or fq.ch_axis not in (0, -nd):  # an axis out of range: the public path raises
        return None
    c = x.shape[0]
    obs = fq.activation_post_process
    if observe:
        settings = _settings(obs, _CHANNEL_OBSERVERS)
        if settings is None or (obs.min_val.size and obs.min_val.size != c):
            return None
        out = np.empty((3, c), _F32)  # new min_val, max_val, scale
        zp = np.empty(c, np.int32)
        state = (out, zp, obs.min_val, obs.max_val)
    else:
        if fq.scale.shape != (c,) or fq.zero_point.shape != (c,):  # the public path raises
            return None
        settings, state = _NO_OBSERVER, (_EMPTY_F32_3, fq.zero_point, _EMPTY_F32, _EMPTY_F32)
    y, mask, yb, mb = _outputs(fq, x)
    fake, qrange = fq.fake_quant_enabled, (fq.quant_min, fq.quant_max)
    ok = _qk.fq_channel_fused(
        x.reshape(-1), yb, mb, fq.scale, observe, fake, *state, settings, qrange
    )
    if not ok:
        return None
    return (
        y,
        mask,
        (out[0], out[1], out[2], zp) if observe else None,
    )  # rows of out: min, max, scale


def ste_backward(grad_y: Any, ctx: Any, out: Any) -> Any:
    """The STE backward of a C-contiguous float32 ``grad_y`` with its own forward's mask
    ``ctx`` (not re-validated), serial; None when the public path must run."""
    if not (
        type(grad_y) is np.ndarray
        and grad_y.dtype is _DT32
        and (out is None or (out is grad_y and grad_y.flags.writeable))
    ):
        return None
    if ctx is None:
        return grad_y.copy() if out is None else grad_y
    if not (
        type(ctx) is np.ndarray
        and ctx.dtype is _DTBOOL
        and grad_y.shape == ctx.shape
        and grad_y.flags.c_contiguous
        and ctx.flags.c_contiguous
        and grad_y.size < _jit.PARALLEL_MIN
    ):
        return None
    g = grad_y.reshape(-1)
    if out is None:
        out = np.empty(grad_y.shape, _F32)
        _qk.ste_backward_serial(g, ctx.reshape(-1), out.reshape(-1))
    else:
        _qk.ste_backward_inplace(g, ctx.reshape(-1))
    return out
