"""FakeQuantize modules: an observer plus fake quantization, with PyTorch's QAT phases.

:class:`FakeQuantize` matches ``torch.ao.quantization.FakeQuantize``: ``forward(x)`` observes
``x`` and recomputes ``scale``/``zero_point`` when the observer is enabled, then fake-quantizes
when fake quantization is enabled (section 6 of the semantics reference)::

    calibration: enable_observer(), disable_fake_quant()   -> statistics only, y = x
    QAT:         enable_observer(), enable_fake_quant()    -> both
    frozen:      disable_observer(), enable_fake_quant()   -> fixed qparams

Backward is hand-written: ``forward`` leaves in ``ctx`` what ``backward`` needs (the STE mask,
or None when fake quantization was off), and ``backward(grad_y, ctx)`` takes that ctx, so one
module can serve many calls (every LSTM time step keeps its own ctx).

:class:`LearnableFakeQuantize` is torch's ``_LearnableFakeQuantize`` (LSQ): trainable scale and
zero point whose gradients ``backward`` accumulates into ``grad_scale`` / ``grad_zero_point``.

The arithmetic is :mod:`nbqat.fake_quant` (bit-exact with torch on float32).
"""

from __future__ import annotations

import copy
import math
from typing import Any

import numpy as np

from nbqat import _jit
from nbqat import fake_quant as _fq
from nbqat.kernels import qat_cpu as _qk
from nbqat.observers import (
    MinMaxObserver,
    MovingAverageMinMaxObserver,
    MovingAveragePerChannelMinMaxObserver,
    PerChannelMinMaxObserver,
    _MinMaxBase,
    _PartialWrapper,
    _with_args,
)

__all__ = ["FakeQuantize", "LearnableFakeQuantize"]

_F32 = np.float32
_CACHED = object()  # default of backward's ctx: "use the ctx of the last forward"

_DT32 = np.dtype(np.float32)
_DTBOOL = np.dtype(np.bool_)
_ONE = _F32(1.0)
#: Typed placeholders for the fused kernels' unused arguments (one compiled specialisation).
_DUMMY_F32 = np.zeros(1, _F32)
_DUMMY_BOOL = np.zeros(1, np.bool_)
_EMPTY_F32 = np.zeros(0, _F32)
_EMPTY_F32_3 = np.zeros((3, 0), _F32)
#: The fused kernels' observer arguments when the observer is disabled (values unused).
_NO_OBSERVER = (False, _ONE, False, 0, 0, 0, _ONE)
_NO_OBSERVER_TENSOR = (_ONE, _ONE) + _NO_OBSERVER


def _make_observer(observer: Any, kwargs: dict[str, Any], who: str) -> _MinMaxBase:
    if isinstance(observer, _MinMaxBase):
        raise TypeError(
            f"{who}: observer must be an observer class or factory (e.g. "
            "MovingAverageMinMaxObserver or MinMaxObserver.with_args(...)), not an instance"
        )
    if not callable(observer):
        raise TypeError(f"{who}: observer must be callable (a class or factory), got {observer!r}")
    obs = observer(**kwargs)
    if not isinstance(obs, _MinMaxBase):
        raise TypeError(f"{who}: observer() must build an nbqat observer, got {type(obs).__name__}")
    return obs


def _flag(state: dict[str, Any], key: str) -> bool:
    v = np.asarray(state[key]).reshape(-1)
    if v.size != 1 or v[0] not in (0, 1):
        raise ValueError(f"load_state_dict: {key} must be one 0/1 value, got {v}")
    return bool(v[0])


def _axis(ch_axis: int | None) -> int:
    """The channel axis of a per-channel quantizer (never None there)."""
    if ch_axis is None:  # pragma: no cover - guarded by is_per_channel
        raise ValueError("per-channel fake quantization needs ch_axis")
    return ch_axis


class _QuantizerPhases:
    """The phase switches and ``with_args`` shared by :class:`FakeQuantize` and
    :class:`LearnableFakeQuantize` (torch's names; ``torch.ao.quantization.FakeQuantizeBase``)."""

    observer_enabled: bool
    fake_quant_enabled: bool

    @classmethod
    def with_args(cls, **kwargs: Any) -> _PartialWrapper:
        """A factory of this module with these keyword arguments (torch's ``with_args``).

        Parameters
        ----------
        **kwargs
            Constructor arguments (``observer=...``, ``quant_min=...``, observer arguments).

        Returns
        -------
        callable
            Each call builds a new, independent module (a :class:`QConfig` holds these).
        """
        return _with_args(cls, **kwargs)

    def enable_observer(self, enabled: bool = True) -> None:
        """Turn statistics collection (and qparams recomputation) on or off.

        Parameters
        ----------
        enabled : bool, default True
        """
        self.observer_enabled = bool(enabled)

    def disable_observer(self) -> None:
        """Freeze the observer (and so scale / zero_point)."""
        self.enable_observer(False)

    def enable_fake_quant(self, enabled: bool = True) -> None:
        """Turn fake quantization on or off (off: forward returns x).

        Parameters
        ----------
        enabled : bool, default True
        """
        self.fake_quant_enabled = bool(enabled)

    def disable_fake_quant(self) -> None:
        """Pass inputs through unchanged (statistics may still be collected)."""
        self.enable_fake_quant(False)


class FakeQuantize(_QuantizerPhases):
    """Observer + fake quantization with torch's phases (``torch.ao.quantization.FakeQuantize``).

    Parameters
    ----------
    observer : observer class or factory, default MovingAverageMinMaxObserver
        Called as ``observer(**observer_kwargs)`` to build :attr:`activation_post_process`
        (``MinMaxObserver.with_args(...)`` factories work).
    quant_min, quant_max : int, optional
        A custom range, passed on to the observer (both or neither).
    **observer_kwargs
        Further observer arguments (dtype, qscheme, ch_axis, averaging_constant, ...).

    Attributes
    ----------
    activation_post_process : observer
    scale : float32 ndarray (1,) or (C,)
        Current scale (``[1.0]`` until the observer has run).
    zero_point : int32 ndarray (1,) or (C,)
    quant_min, quant_max : int
    ch_axis : int or None
        The observer's channel axis (per channel) or None (per tensor).
    is_per_channel : bool
    observer_enabled, fake_quant_enabled : bool
    ctx : bool ndarray or None
        What the last :meth:`forward` left for :meth:`backward` (the STE mask; None when fake
        quantization was disabled).

    References
    ----------
    ``torch/ao/quantization/fake_quantize.py`` (torch 2.13).
    """

    #: The quantizer protocol's flag: FakeQuantize follows its observer, learns nothing.
    learnable = False

    def __init__(
        self,
        observer: Any = MovingAverageMinMaxObserver,
        quant_min: int | None = None,
        quant_max: int | None = None,
        **observer_kwargs: Any,
    ) -> None:
        who = type(self).__name__
        if quant_min is not None or quant_max is not None:
            if quant_min is None or quant_max is None:
                raise ValueError(f"{who}: give both quant_min and quant_max, or neither")
            if quant_min > quant_max:
                raise ValueError(
                    f"{who}: quant_min ({quant_min}) must be <= quant_max ({quant_max})"
                )
            observer_kwargs.update(quant_min=quant_min, quant_max=quant_max)
        self.activation_post_process = _make_observer(observer, observer_kwargs, who)
        obs = self.activation_post_process
        self.quant_min = obs.quant_min
        self.quant_max = obs.quant_max
        self.dtype = obs.dtype
        self.qscheme = obs.qscheme
        self.is_per_channel = obs._per_channel
        self.ch_axis = obs.ch_axis if self.is_per_channel else None
        self.scale = np.array([1.0], _F32)
        self.zero_point = np.array([0], np.int32)
        self.observer_enabled = True
        self.fake_quant_enabled = True
        self.ctx: Any = None
        self._ran = False

    def calculate_qparams(self) -> tuple[np.ndarray, np.ndarray]:
        """The observer's current ``(scale float32, zero_point int32)`` (shape (1,) or (C,))."""
        return self.activation_post_process.calculate_qparams()

    # -- forward / backward ------------------------------------------------------------------
    def __call__(self, x: Any) -> Any:
        return self.forward(x)

    def forward(self, x: Any) -> Any:
        """Observe (if enabled), then fake-quantize (if enabled).

        Parameters
        ----------
        x : float16/float32/float64 ndarray or CUDA device array

        Returns
        -------
        y : array like ``x``
            ``fake_quantize_per_{tensor,channel}_affine(x, scale, zero_point, ...)``, or ``x``
            itself when fake quantization is disabled. Afterwards :attr:`ctx` holds the bool mask
            (or None).

        Raises
        ------
        TypeError, ValueError
            Bad input (from the observer or the fake-quantize function); the observer state is
            unchanged when the observer rejects the batch.
        """
        observe = self.observer_enabled
        if observe and getattr(self.activation_post_process, "process_group", None) is not None:
            # a data-parallel run: the observer combines every rank's statistics (a collective),
            # then the fused kernel fake-quantizes with the qparams (same bits either way)
            self.activation_post_process(x)
            s, z = self.activation_post_process.calculate_qparams()
            self.scale = s.astype(_F32)
            self.zero_point = z.astype(np.int32)
            observe = False
        if type(x) is np.ndarray and x.dtype is _DT32 and x.flags.c_contiguous:
            n = x.size
            if 0 < n < _jit.PARALLEL_MIN:
                if self.is_per_channel:
                    y = self._forward_channel_fast(x, observe)
                else:
                    y = self._forward_tensor_fast(x, observe)
                if y is not None:
                    return y
        if observe:
            self.activation_post_process(x)
            s, z = self.activation_post_process.calculate_qparams()
            self.scale = s.astype(_F32)
            self.zero_point = z.astype(np.int32)
        if not self.fake_quant_enabled:
            self.ctx = None
            self._ran = True
            return x
        if self.is_per_channel:
            y, mask = _fq.fake_quantize_per_channel_affine_cachemask(
                x, self.scale, self.zero_point, _axis(self.ch_axis), self.quant_min, self.quant_max
            )
        else:
            y, mask = _fq.fake_quantize_per_tensor_affine_cachemask(
                x, self.scale, self.zero_point, self.quant_min, self.quant_max
            )
        self.ctx = mask
        self._ran = True
        return y

    def backward(self, grad_y: Any, ctx: Any = _CACHED, *, out: Any = None) -> Any:
        """Straight-through estimator: ``grad_x = grad_y * mask``.

        Parameters
        ----------
        grad_y : float array of the forward input's shape
        ctx : bool ndarray or None, optional
            A ctx saved from :attr:`ctx` after a forward; default: the last forward's. None
            (fake quantization was off) returns a copy of ``grad_y``.
        out : array, optional
            Preallocated result of ``grad_y``'s shape and dtype; ``out=grad_y`` works in place
            (saves an allocation and a pass over fresh memory when the caller owns ``grad_y``).

        Returns
        -------
        grad_x : array like ``grad_y`` (``out`` when given)

        Raises
        ------
        RuntimeError
            No ctx given and forward has never run.
        TypeError, ValueError
            Bad ``grad_y``, ``ctx`` or ``out`` (:func:`nbqat.fake_quant.fake_quantize_backward`).
        """
        if ctx is _CACHED:
            if not self._ran:
                raise RuntimeError(f"{type(self).__name__}.backward: call forward first")
            ctx = self.ctx
        if (
            type(grad_y) is np.ndarray
            and grad_y.dtype is _DT32
            and (out is None or (out is grad_y and grad_y.flags.writeable))
        ):
            # the QAT hot path: the mask is our own forward's, skip re-validating it
            if ctx is None:
                return grad_y.copy() if out is None else grad_y
            if (
                type(ctx) is np.ndarray
                and ctx.dtype is _DTBOOL
                and grad_y.shape == ctx.shape
                and grad_y.flags.c_contiguous
                and ctx.flags.c_contiguous
                and grad_y.size < _jit.PARALLEL_MIN
            ):
                g = grad_y.reshape(-1)
                if out is None:
                    out = np.empty(grad_y.shape, _F32)
                    _qk.ste_backward_serial(g, ctx.reshape(-1), out.reshape(-1))
                else:
                    _qk.ste_backward_inplace(g, ctx.reshape(-1))
                return out
        return _fq.fake_quantize_backward(grad_y, ctx, out=out)

    def _forward_tensor_fast(self, x: np.ndarray, observe: bool) -> Any:
        """Per-tensor :meth:`forward` of a C-contiguous float32 NumPy ``x`` with
        ``0 < x.size < PARALLEL_MIN`` (the QAT model's hot path, ~130 calls per training step):
        ONE compiled call (:func:`nbqat.kernels.qat_cpu.fq_tensor_fused`) does the observer's
        min/max pass, its update, the qparams and the fake quantization, with the same results
        and state, bit for bit, as the public path, and without re-validating what this module
        guarantees itself (its qparams are float32 > 0 with the zero point in range). Returns
        None -- with nothing changed -- when the input or the state needs the public path
        (non-finite data or state, an overflowing zero point, a custom observer). ``observe``
        False fake-quantizes with the current qparams (the observer disabled, or already
        updated by :meth:`forward`)."""
        fake = self.fake_quant_enabled
        if observe:
            obs = self.activation_post_process
            cls = type(obs)
            if cls is not MovingAverageMinMaxObserver and cls is not MinMaxObserver:
                return None
            moving = cls._moving
            symmetric = obs.symmetric
            args = (
                obs._min[()],
                obs._max[()],
                moving,
                _F32(obs.averaging_constant) if moving else _ONE,
                symmetric,
                obs._symmetric_zero_point() if symmetric else 0,
                obs.quant_min,
                obs.quant_max,
                obs.eps,
            )
        else:
            args = _NO_OBSERVER_TENSOR
        if fake:
            y = np.empty(x.shape, _F32)
            mask = np.empty(x.shape, np.bool_)
            ok, mn, mx, s, z = _qk.fq_tensor_fused(
                x.reshape(-1),
                y.reshape(-1),
                mask.reshape(-1),
                self.scale[0],
                self.zero_point[0],
                observe,
                True,
                *args,
                self.quant_min,
                self.quant_max,
            )
        else:
            y, mask = x, None
            ok, mn, mx, s, z = _qk.fq_tensor_fused(
                x.reshape(-1),
                _DUMMY_F32,
                _DUMMY_BOOL,
                self.scale[0],
                self.zero_point[0],
                observe,
                False,
                *args,
                self.quant_min,
                self.quant_max,
            )
        if not ok:
            return None
        if observe:
            obs._min = np.array(mn, _F32)
            obs._max = np.array(mx, _F32)
            self.scale = np.array([s], _F32)
            self.zero_point = np.array([z], np.int32)
        self.ctx = mask
        self._ran = True
        return y

    def _forward_channel_fast(self, x: np.ndarray, observe: bool) -> Any:
        """Per-channel twin of :meth:`_forward_tensor_fast` (weights: channel axis first,
        :func:`nbqat.kernels.qat_cpu.fq_channel_fused`). Returns None -- with nothing changed --
        for another channel axis, a channel count the state does not have, or the cases of
        :meth:`_forward_tensor_fast`."""
        nd = x.ndim
        if nd == 0 or self.ch_axis % nd != 0:  # type: ignore[operator]
            return None
        c = x.shape[0]
        if observe:
            obs = self.activation_post_process
            cls = type(obs)
            if (
                cls is not MovingAveragePerChannelMinMaxObserver
                and cls is not PerChannelMinMaxObserver
            ):
                return None
            old_min = obs._min
            if old_min.size and old_min.size != c:
                return None
            out = np.empty((3, c), _F32)  # new min_val, max_val, scale
            zp = np.empty(c, np.int32)
            moving = cls._moving
            symmetric = obs.symmetric
            args = (
                out,
                zp,
                old_min,
                obs._max,
                moving,
                _F32(obs.averaging_constant) if moving else _ONE,
                symmetric,
                obs._symmetric_zero_point() if symmetric else 0,
                obs.quant_min,
                obs.quant_max,
                obs.eps,
            )
        else:
            scale, zp = self.scale, self.zero_point
            if scale.shape != (c,) or zp.shape != (c,):  # let the public path raise its error
                return None
            args = (_EMPTY_F32_3, zp, _EMPTY_F32, _EMPTY_F32) + _NO_OBSERVER
        if self.fake_quant_enabled:
            y = np.empty(x.shape, _F32)
            mask = np.empty(x.shape, np.bool_)
            ok = _qk.fq_channel_fused(
                x.reshape(-1),
                y.reshape(-1),
                mask.reshape(-1),
                self.scale,
                observe,
                True,
                *args,
                self.quant_min,
                self.quant_max,
            )
        else:
            y, mask = x, None
            ok = _qk.fq_channel_fused(
                x.reshape(-1),
                _DUMMY_F32,
                _DUMMY_BOOL,
                self.scale,
                observe,
                False,
                *args,
                self.quant_min,
                self.quant_max,
            )
        if not ok:
            return None
        if observe:
            obs._min, obs._max, self.scale = out  # three (c,) rows
            self.zero_point = zp
        self.ctx = mask
        self._ran = True
        return y

    # -- state -------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, np.ndarray]:
        """torch's keys: flags, ``scale``, ``zero_point`` and ``activation_post_process.*``."""
        out = {
            "fake_quant_enabled": np.array([int(self.fake_quant_enabled)], np.uint8),
            "observer_enabled": np.array([int(self.observer_enabled)], np.uint8),
            "scale": self.scale.copy(),
            "zero_point": self.zero_point.copy(),
        }
        for k, v in self.activation_post_process.state_dict().items():
            out["activation_post_process." + k] = v
        return out

    def load_state_dict(self, state: dict[str, Any], strict: bool = True) -> None:
        """Load :meth:`state_dict` output; nothing changes unless everything is valid.

        Parameters
        ----------
        state : mapping
        strict : bool, default True
            Reject unexpected keys.

        Raises
        ------
        KeyError
            Missing keys.
        ValueError
            Unexpected keys (strict), wrong shapes or dtypes, invalid values.
        """
        need = ["fake_quant_enabled", "observer_enabled", "scale", "zero_point"]
        missing = [k for k in need if k not in state]
        if missing:
            raise KeyError(f"load_state_dict: missing key(s) {missing}")
        pre = "activation_post_process."
        sub = {k[len(pre) :]: v for k, v in state.items() if k.startswith(pre)}
        extra = sorted(k for k in state if k not in need and not k.startswith(pre))
        if strict and extra:
            raise ValueError(f"load_state_dict: unexpected key(s) {extra} (pass strict=False)")
        fq_on, obs_on = _flag(state, "fake_quant_enabled"), _flag(state, "observer_enabled")
        scale = np.array(state["scale"], dtype=_F32).reshape(-1)
        zp_raw = np.asarray(state["zero_point"])
        if zp_raw.dtype.kind not in "iu":
            raise ValueError("load_state_dict: zero_point must be an integer array")
        zp = zp_raw.astype(np.int32).reshape(-1)
        if scale.size == 0 or scale.shape != zp.shape:
            raise ValueError(
                f"load_state_dict: scale {scale.shape} and zero_point {zp.shape} must be "
                "non-empty with equal shapes"
            )
        if not self.is_per_channel and scale.size != 1:
            raise ValueError(
                f"load_state_dict: per-tensor scale must have 1 element, got {scale.size}"
            )
        if not np.all(np.isfinite(scale) & (scale > 0)):
            raise ValueError("load_state_dict: scale must be finite and > 0")
        if np.any((zp < self.quant_min) | (zp > self.quant_max)):
            raise ValueError(
                f"load_state_dict: zero_point outside [{self.quant_min}, {self.quant_max}]"
            )
        obs = copy.deepcopy(self.activation_post_process)
        obs.load_state_dict(sub, strict=strict)
        self.activation_post_process = obs
        self.scale, self.zero_point = scale, zp
        self.fake_quant_enabled, self.observer_enabled = fq_on, obs_on

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(fake_quant_enabled={self.fake_quant_enabled}, "
            f"observer_enabled={self.observer_enabled}, quant_min={self.quant_min}, "
            f"quant_max={self.quant_max}, dtype={self.dtype}, qscheme={self.qscheme}, "
            f"ch_axis={self.ch_axis}, scale={self.scale}, zero_point={self.zero_point}, "
            f"activation_post_process={self.activation_post_process!r})"
        )


class LearnableFakeQuantize(_QuantizerPhases):
    """LSQ fake quantization with a trainable scale and zero point (torch's
    ``_LearnableFakeQuantize``).

    Parameters
    ----------
    observer : observer class or factory, default MovingAverageMinMaxObserver
        Gives the static estimates of scale / zero point while the observer is enabled.
    quant_min, quant_max : int, default 0, 255
        The integer range (passed on to the observer).
    scale, zero_point : float, default 1.0, 0.0
        Initial values (float32).
    channel_len : int, default -1
        -1 per tensor (shape (1,)); else the channel count of the initial per-channel arrays.
    use_grad_scaling : bool, default True
        Scale the scale / zero-point gradients by ``1 / sqrt(numel * quant_max)`` (the LSQ paper's
        choice and the reference's module default; torch's own default is False).
    **observer_kwargs
        Further observer arguments.

    Attributes
    ----------
    scale, zero_point : float32 ndarray (1,) or (C,)
    grad_scale, grad_zero_point : float32 ndarray, shape of ``scale``
        Accumulated by :meth:`backward`; cleared by :meth:`zero_grad`.
    observer_enabled, fake_quant_enabled, learning_enabled : bool
    ctx : tuple or None
        ``(x, scale, zero_point, grad_factor)`` of the last forward (None: fake quant off).
        ``x`` is kept by reference: do not modify it in place before backward.

    Notes
    -----
    Forward: if observing, copy the observer's qparams into scale / zero_point, else clamp the
    scale to ``>= eps``; if fake-quantizing (symmetric qschemes zero the zero point first, as
    torch), ``fake_quantize_learnable_per_{tensor,channel}_affine``.

    References
    ----------
    S. K. Esser et al., "Learned Step Size Quantization", ICLR 2020.
    ``torch/ao/quantization/_learnable_fake_quantize.py`` (torch 2.13).
    """

    #: The quantizer protocol's flag: scale and zero point are learned (LSQ).
    learnable = True

    def __init__(
        self,
        observer: Any = MovingAverageMinMaxObserver,
        quant_min: int = 0,
        quant_max: int = 255,
        scale: float = 1.0,
        zero_point: float = 0.0,
        channel_len: int = -1,
        use_grad_scaling: bool = True,
        **observer_kwargs: Any,
    ) -> None:
        who = type(self).__name__
        if quant_min >= quant_max:
            raise ValueError(f"{who}: quant_min ({quant_min}) must be < quant_max ({quant_max})")
        if not (isinstance(channel_len, int) and (channel_len == -1 or channel_len > 0)):
            raise ValueError(
                f"{who}: channel_len must be -1 or a positive int, got {channel_len!r}"
            )
        s = _F32(scale)
        if not (np.isfinite(s) and s > 0):
            raise ValueError(f"{who}: scale must be finite and > 0, got {scale!r}")
        observer_kwargs.update(quant_min=quant_min, quant_max=quant_max)
        self.activation_post_process = _make_observer(observer, observer_kwargs, who)
        obs = self.activation_post_process
        self.quant_min, self.quant_max = obs.quant_min, obs.quant_max
        self.dtype, self.qscheme = obs.dtype, obs.qscheme
        self.is_per_channel = obs._per_channel
        self.ch_axis = obs.ch_axis if self.is_per_channel else None
        n = 1 if channel_len == -1 else channel_len
        self.scale = np.full(n, s, _F32)
        self.zero_point = np.full(n, _F32(zero_point), _F32)
        self.grad_scale = np.zeros(n, _F32)
        self.grad_zero_point = np.zeros(n, _F32)
        self.use_grad_scaling = bool(use_grad_scaling)
        self.eps = _F32(np.finfo(np.float32).eps)
        self.observer_enabled = True
        self.fake_quant_enabled = True
        self.learning_enabled = False
        self.ctx: Any = None
        self._ran = False

    def enable_param_learning(self) -> LearnableFakeQuantize:
        """Learn scale / zero point: learning on, fake quant on, observer off. Returns self."""
        self.learning_enabled, self.fake_quant_enabled, self.observer_enabled = True, True, False
        return self

    def enable_static_estimate(self) -> LearnableFakeQuantize:
        """Observer estimates: learning off, fake quant on, observer on. Returns self."""
        self.learning_enabled, self.fake_quant_enabled, self.observer_enabled = False, True, True
        return self

    def enable_static_observation(self) -> LearnableFakeQuantize:
        """Observe only: learning off, fake quant off, observer on. Returns self."""
        self.learning_enabled, self.fake_quant_enabled, self.observer_enabled = False, False, True
        return self

    def calculate_qparams(self) -> tuple[np.ndarray, np.ndarray]:
        """Clamp the scale to ``>= eps`` (in place, as torch) and return ``(scale float32,
        clamp(rint(zero_point), quant_min, quant_max) int32)``."""
        np.maximum(self.scale, self.eps, out=self.scale)
        zp = np.clip(np.rint(self.zero_point), self.quant_min, self.quant_max)
        return self.scale.copy(), zp.astype(np.int32)

    def zero_grad(self) -> None:
        """Set ``grad_scale`` and ``grad_zero_point`` to zero."""
        self.grad_scale[...] = 0
        self.grad_zero_point[...] = 0

    def _set_shape(self, n: int) -> None:
        if self.scale.size != n:
            self.scale = np.ones(n, _F32)
            self.zero_point = np.zeros(n, _F32)
            self.grad_scale = np.zeros(n, _F32)
            self.grad_zero_point = np.zeros(n, _F32)

    def __call__(self, x: Any) -> Any:
        return self.forward(x)

    def forward(self, x: Any) -> Any:
        """Observe / clamp, then LSQ fake quantization (see the class Notes).

        Parameters
        ----------
        x : float ndarray or CUDA device array

        Returns
        -------
        y : array like ``x`` (``x`` itself when fake quantization is disabled)
        """
        if self.observer_enabled:
            self.activation_post_process(x)
            s, z = self.activation_post_process.calculate_qparams()
            self._set_shape(s.size)
            self.scale[...] = s
            self.zero_point[...] = z
        else:
            np.maximum(self.scale, self.eps, out=self.scale)
        if not self.fake_quant_enabled:
            self.ctx = None
            self._ran = True
            return x
        if self.qscheme.endswith("symmetric"):
            self.zero_point[...] = 0
        numel = int(np.prod(x.shape, dtype=np.int64))
        # LSQ's gradient factor 1/sqrt(numel * quant_max); torch divides by zero on an
        # empty batch, nbqat passes it through (no element, no gradient: any factor is exact)
        gf = 1.0 / math.sqrt(numel * self.quant_max) if self.use_grad_scaling and numel else 1.0
        s, z = self.scale.copy(), self.zero_point.copy()
        if self.is_per_channel:
            y = _fq.fake_quantize_learnable_per_channel_affine(
                x, s, z, _axis(self.ch_axis), self.quant_min, self.quant_max, gf
            )
        else:
            y = _fq.fake_quantize_learnable_per_tensor_affine(
                x, s, z, self.quant_min, self.quant_max, gf
            )
        self.ctx = (x, s, z, gf)
        self._ran = True
        return y

    def backward(self, grad_y: Any, ctx: Any = _CACHED) -> Any:
        """LSQ backward: returns ``grad_x`` and accumulates ``grad_scale``/``grad_zero_point``.

        Parameters
        ----------
        grad_y : float array of the forward input's shape
        ctx : tuple or None, optional
            A saved :attr:`ctx` (default: the last forward's). None returns a copy of ``grad_y``.

        Returns
        -------
        grad_x : array like ``grad_y``

        Raises
        ------
        RuntimeError
            No ctx given and forward has never run.
        ValueError
            The ctx's qparams have another shape than the current scale.
        """
        if ctx is _CACHED:
            if not self._ran:
                raise RuntimeError(f"{type(self).__name__}.backward: call forward first")
            ctx = self.ctx
        if ctx is None:
            return _fq.fake_quantize_backward(grad_y, None)
        x, s, z, gf = ctx
        if s.shape != self.grad_scale.shape:
            raise ValueError(
                f"backward: ctx qparams have shape {s.shape}, grad_scale {self.grad_scale.shape}"
            )
        if self.is_per_channel:
            gx, gs, gz = _fq.fake_quantize_learnable_per_channel_affine_backward(
                grad_y, x, s, z, _axis(self.ch_axis), self.quant_min, self.quant_max, gf
            )
        else:
            gx, gs, gz = _fq.fake_quantize_learnable_per_tensor_affine_backward(
                grad_y, x, s, z, self.quant_min, self.quant_max, gf
            )
        self.grad_scale += np.asarray(gs, _F32).reshape(self.grad_scale.shape)
        self.grad_zero_point += np.asarray(gz, _F32).reshape(self.grad_zero_point.shape)
        return gx

    def state_dict(self) -> dict[str, np.ndarray]:
        """Flags, ``scale``, ``zero_point`` (float32), ``eps`` and ``activation_post_process.*``."""
        out = {
            "fake_quant_enabled": np.array([int(self.fake_quant_enabled)], np.uint8),
            "static_enabled": np.array([int(self.observer_enabled)], np.uint8),
            "learning_enabled": np.array([int(self.learning_enabled)], np.uint8),
            "eps": np.array([self.eps], _F32),
            "scale": self.scale.copy(),
            "zero_point": self.zero_point.copy(),
        }
        for k, v in self.activation_post_process.state_dict().items():
            out["activation_post_process." + k] = v
        return out

    def load_state_dict(self, state: dict[str, Any], strict: bool = True) -> None:
        """Load :meth:`state_dict` output; nothing changes unless everything is valid.

        Parameters
        ----------
        state : mapping
        strict : bool, default True
            Reject unexpected keys.

        Raises
        ------
        KeyError
            Missing keys.
        ValueError
            Unexpected keys (strict), wrong shapes, invalid values.
        """
        need = ["fake_quant_enabled", "static_enabled", "learning_enabled", "scale", "zero_point"]
        missing = [k for k in need if k not in state]
        if missing:
            raise KeyError(f"load_state_dict: missing key(s) {missing}")
        pre = "activation_post_process."
        sub = {k[len(pre) :]: v for k, v in state.items() if k.startswith(pre)}
        extra = sorted(k for k in state if k not in need + ["eps"] and not k.startswith(pre))
        if strict and extra:
            raise ValueError(f"load_state_dict: unexpected key(s) {extra} (pass strict=False)")
        flags = [_flag(state, k) for k in need[:3]]
        scale = np.array(state["scale"], dtype=_F32).reshape(-1)
        zp = np.array(state["zero_point"], dtype=_F32).reshape(-1)
        if scale.size == 0 or scale.shape != zp.shape:
            raise ValueError("load_state_dict: scale and zero_point must be non-empty, same shape")
        if not np.all(np.isfinite(scale) & (scale > 0)) or not np.all(np.isfinite(zp)):
            raise ValueError("load_state_dict: scale must be finite and > 0, zero_point finite")
        obs = copy.deepcopy(self.activation_post_process)
        obs.load_state_dict(sub, strict=strict)
        self.activation_post_process = obs
        self._set_shape(scale.size)
        self.scale[...], self.zero_point[...] = scale, zp
        self.fake_quant_enabled, self.observer_enabled, self.learning_enabled = flags
