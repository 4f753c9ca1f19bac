"""Min/max observers: PyTorch's calibration statistics and qparams, with a non-finite policy.

For the same stream of float32 batches, ``calculate_qparams()`` of every observer here equals
``torch.ao.quantization`` (torch 2.13) of the same kind bit for bit: per tensor and per channel
(any ``ch_axis``, negative included), affine and symmetric, ``reduce_range``, custom ranges.

The statistics come from one compiled pass over the data (:mod:`nbqat.kernels.observe_cpu`, or the
``@cuda.jit`` twins in :mod:`nbqat.kernels.observe_cuda` for CUDA arrays) that finds the minimum
and maximum together, with no temporary copy of float32 C- or F-contiguous input and no transpose
for any channel axis. The observer state (``min_val``, ``max_val``) always lives on the host as
NumPy float32 arrays; ``calculate_qparams`` is a few float32 NumPy operations on it.

Non-finite values
-----------------
PyTorch's observers let one NaN batch poison the running min/max forever (the qparams become NaN,
or an assertion fires much later). Every observer here takes ``nonfinite=``:

* ``"raise"`` (default): a batch holding NaN or +-Inf raises ValueError saying how many of each
  it held; the observer state is left exactly as it was.
* ``"ignore"``: NaN and +-Inf values are skipped; a batch (or, per channel, a channel) without
  any finite value leaves the state unchanged.
* ``"propagate"``: PyTorch's behaviour (NaN and Inf flow into the running min/max). When the state
  holds NaN, ``calculate_qparams`` warns and returns what torch returns.
"""

from __future__ import annotations

import functools
import warnings
from typing import Any

import numpy as np

from nbqat import _cuda, _jit
from nbqat.kernels import observe_cpu as _k

__all__ = [
    "MinMaxObserver",
    "MovingAverageMinMaxObserver",
    "MovingAveragePerChannelMinMaxObserver",
    "PerChannelMinMaxObserver",
]

_F32 = np.float32
#: float32 machine epsilon, torch's default ``eps`` (``torch.finfo(torch.float32).eps``).
EPS = float(np.finfo(np.float32).eps)

#: name -> (lowest, highest, signed) of the full integer range of each quantized dtype.
_DTYPES: dict[str, tuple[int, int, bool]] = {
    "qint8": (-128, 127, True),
    "quint8": (0, 255, False),
    "qint4": (-8, 7, True),
    "quint4": (0, 15, False),
    "qint16": (-(2**15), 2**15 - 1, True),
    "qint32": (-(2**31), 2**31 - 1, True),
}
_QSCHEMES = (
    "per_tensor_affine",
    "per_tensor_symmetric",
    "per_channel_affine",
    "per_channel_symmetric",
)
_NONFINITE = ("raise", "ignore", "propagate")


class _PartialWrapper:
    """A factory holding keyword arguments (torch's ``_PartialWrapper``): call it for a new
    object; ``with_args`` adds or overrides arguments."""

    def __init__(self, p: functools.partial) -> None:
        self.p = p

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.p(*args, **kwargs)

    def with_args(self, **kwargs: Any) -> _PartialWrapper:
        return _PartialWrapper(functools.partial(self.p, **kwargs))

    def __repr__(self) -> str:
        return f"{self.p.func.__name__}.with_args({self.p.keywords})"


def _with_args(cls_or_factory: Any, **kwargs: Any) -> _PartialWrapper:
    return _PartialWrapper(functools.partial(cls_or_factory, **kwargs))


def _norm_name(value: Any, what: str, allowed: tuple[str, ...]) -> str:
    """Normalize ``"torch.qint8"`` / ``"qint8"`` style names (``str(torch.qint8)`` works too)."""
    if not isinstance(value, str):
        value = str(value)
    name = value.removeprefix("torch.")
    if name not in allowed:
        raise ValueError(f"unknown {what} {value!r}: use one of {', '.join(allowed)}")
    return name


def _resolve_range(
    dtype: str, reduce_range: bool, quant_min: Any, quant_max: Any
) -> tuple[int, int, bool]:
    """``(quant_min, quant_max, has_customized_qrange)`` as torch's ``calculate_qmin_qmax``.

    Default ranges: qint8 [-128, 127] (reduce_range [-64, 63]), quint8 [0, 255] ([0, 127]),
    qint4 [-8, 7] ([-4, 3]), quint4 [0, 15] ([0, 7]), qint16 and qint32 their full ranges
    (reduce_range ignored, as torch). A custom range must contain 0 and lie inside the dtype's
    range; reduce_range halves it (floor division, torch's rule).
    """
    lo, hi, _ = _DTYPES[dtype]
    if (quant_min is None) != (quant_max is None):
        raise ValueError(
            "give both quant_min and quant_max (a custom range) or neither (the dtype's range); "
            f"got quant_min={quant_min!r}, quant_max={quant_max!r}"
        )
    if quant_min is None:
        if dtype in ("qint16", "qint32") or not reduce_range:
            return lo, hi, False
        return lo // 2, hi // 2, False
    for name, v in (("quant_min", quant_min), ("quant_max", quant_max)):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
            raise TypeError(f"{name} must be an int, got {type(v).__name__} {v!r}")
    qmin, qmax = int(quant_min), int(quant_max)
    if not qmin <= 0 <= qmax:
        raise ValueError(
            f"the quantization range [{qmin}, {qmax}] must contain 0 (quant_min <= 0 <= quant_max)"
        )
    if qmin >= qmax:
        raise ValueError(f"quant_min ({qmin}) must be strictly less than quant_max ({qmax})")
    if qmin < lo or qmax > hi:
        raise ValueError(
            f"the range [{qmin}, {qmax}] does not fit dtype {dtype!r} ([{lo}, {hi}]): "
            "pick a wider dtype or a narrower range"
        )
    if reduce_range:
        qmin, qmax = qmin // 2, qmax // 2
    return qmin, qmax, True


def _decode(keys: Any) -> np.ndarray:
    """float32 values of order keys (the key map is its own inverse)."""
    k = np.asarray(keys, dtype=np.int64).astype(np.int32)
    return (k ^ ((k >> 31) & np.int32(0x7FFFFFFF))).view(np.float32)


def _as_f32_host(x: np.ndarray) -> np.ndarray:
    """float32 view of ``x`` (copy only for float16/float64, as torch's ``x.to(float32)``)."""
    return x if x.dtype == np.float32 else x.astype(np.float32)


def _stats_cpu_tensor(x: np.ndarray) -> tuple[np.ndarray, ...]:
    """(fmin, fmax, n_nan, n_pinf, n_ninf), each shape (1,), of a non-empty NumPy array."""
    flat = np.ravel(_as_f32_host(x), order="K")  # a view for any contiguous memory order
    if not flat.flags.c_contiguous:  # pragma: no cover - ravel always returns contiguous
        flat = np.ascontiguousarray(flat)
    b = flat.view(np.int32)
    if b.size < _jit.PARALLEL_MIN:
        kmin, kmax = _k.row_keys(b, 0, b.size, _k.KEY_POS_INF, _k.KEY_NEG_INF)
    else:
        kmin, kmax = _k.minmax_keys_1d(b)
    if kmin > _k.KEY_NEG_INF and kmax < _k.KEY_POS_INF:
        z = np.zeros(1, np.int64)
        return _decode([kmin]), _decode([kmax]), z, z, z
    r = _k.minmax_finite_3d(b, 1, 1, b.size)[0]
    return (_decode(r[0:1]), _decode(r[1:2]), r[2:3].copy(), r[3:4].copy(), r[4:5].copy())


def _outer_inner(shape: tuple[int, ...], axis: int) -> tuple[int, int, int]:
    outer = int(np.prod(shape[:axis], dtype=np.int64))
    inner = int(np.prod(shape[axis + 1 :], dtype=np.int64))
    return outer, int(shape[axis]), inner


def _stats_cpu_channel(x: np.ndarray, axis: int) -> tuple[np.ndarray, ...]:
    """Per-channel (fmin, fmax, n_nan, n_pinf, n_ninf), each (C,), over a (outer, C, inner) view."""
    x32 = _as_f32_host(x)
    if x32.flags.c_contiguous:
        v, ax = x32, axis
    elif x32.flags.f_contiguous:  # the transpose is C-contiguous: no copy
        v, ax = x32.T, x32.ndim - 1 - axis
    else:  # arbitrary strides: one contiguous copy
        v, ax = np.ascontiguousarray(x32), axis
    outer, c, inner = _outer_inner(v.shape, ax)
    b = v.reshape(-1).view(np.int32)
    kern = _k.minmax_keys_3d if b.size >= _jit.PARALLEL_MIN else _k.minmax_keys_3d_serial
    kmin, kmax = kern(b, outer, c, inner)
    if kmin.min() > _k.KEY_NEG_INF and kmax.max() < _k.KEY_POS_INF:
        z = np.zeros(c, np.int64)
        return _decode(kmin), _decode(kmax), z, z, z
    r = _k.minmax_finite_3d(b, outer, c, inner)
    return (_decode(r[:, 0]), _decode(r[:, 1]), r[:, 2].copy(), r[:, 3].copy(), r[:, 4].copy())


def _device(x: Any) -> Any:
    """A Numba device array for ``x`` (numba's own, and the simulator's, pass through)."""
    return x if hasattr(x, "copy_to_host") else _cuda.as_device_array(x)


def _stats_cuda(x: Any, axis: int | None) -> tuple[np.ndarray, ...]:
    """The CUDA twin of the two functions above (results copied to the host: 5 * C numbers)."""
    from nbqat.kernels import observe_cuda as _kc

    cuda = _cuda.cuda
    d = _device(x)
    tpb = _cuda.THREADS_PER_BLOCK
    if tpb > _kc.MAX_TPB:  # pragma: no cover - configuration error
        raise RuntimeError(f"nbqat._cuda.THREADS_PER_BLOCK must be <= {_kc.MAX_TPB}")
    flat = d.reshape(d.size)
    if axis is None:
        blocks, tpb = _cuda.grid_1d(d.size)
        pmin = cuda.device_array(blocks, np.float32)
        pmax = cuda.device_array(blocks, np.float32)
        pcnt = cuda.device_array((blocks, 3), np.int64)
        _kc.minmax_partials_kernel[blocks, tpb](flat, pmin, pmax, pcnt)
        omin = cuda.device_array(1, np.float32)
        omax = cuda.device_array(1, np.float32)
        ocnt = cuda.device_array((1, 3), np.int64)
        _kc.minmax_final_kernel[1, 1](pmin, pmax, pcnt, omin, omax, ocnt)
    else:
        outer, c, inner = _outer_inner(tuple(d.shape), axis)
        blocks = max(1, min(_cuda.MAX_BLOCKS, c))
        omin = cuda.device_array(c, np.float32)
        omax = cuda.device_array(c, np.float32)
        ocnt = cuda.device_array((c, 3), np.int64)
        _kc.minmax_channel_kernel[blocks, tpb](flat, outer, c, inner, omin, omax, ocnt)
    cnt = ocnt.copy_to_host()
    return (
        omin.copy_to_host(),
        omax.copy_to_host(),
        cnt[:, 0].copy(),
        cnt[:, 1].copy(),
        cnt[:, 2].copy(),
    )


def _check_input(x: Any, who: str) -> bool:
    """Validate an observed batch; return True for a CUDA array."""
    if _cuda.is_cuda_array(x) or hasattr(x, "copy_to_host"):  # + the simulator's arrays
        _cuda.require_cuda(who)
        d = _device(x)
        if np.dtype(d.dtype) not in (np.float16, np.float32, np.float64):
            raise TypeError(
                f"{who}: x must be a float16/float32/float64 array, got dtype {d.dtype}: "
                "convert it first (x.astype(np.float32))"
            )
        if not d.is_c_contiguous():
            raise ValueError(
                f"{who}: CUDA input must be C-contiguous; make a contiguous copy first "
                "(numba.cuda.device_array + copy, or cupy.ascontiguousarray)"
            )
        return True
    if not isinstance(x, np.ndarray):
        raise TypeError(
            f"{who}: x must be a NumPy array or a CUDA device array, got {type(x).__name__}: "
            "wrap it with np.asarray(x, dtype=np.float32)"
        )
    if x.dtype not in (np.float16, np.float32, np.float64):
        raise TypeError(
            f"{who}: x must be a float16/float32/float64 array, got dtype {x.dtype}: "
            "convert it first (x.astype(np.float32))"
        )
    return False


class _MinMaxBase:
    """Shared machinery of the four observers (configuration, qparams, state, policy)."""

    _per_channel = False
    _moving = False

    def __init__(
        self,
        *,
        dtype: str,
        qscheme: str,
        reduce_range: bool,
        quant_min: int | None,
        quant_max: int | None,
        eps: float,
        nonfinite: str,
        averaging_constant: float | None = None,
        ch_axis: int | None = None,
    ) -> None:
        name = type(self).__name__
        self.dtype = _norm_name(dtype, "dtype", tuple(_DTYPES))
        self.qscheme = _norm_name(qscheme, "qscheme", _QSCHEMES)
        if self.qscheme.startswith("per_channel") != self._per_channel:
            kind = "per_channel" if self._per_channel else "per_tensor"
            raise ValueError(
                f"{name} takes a {kind}_affine or {kind}_symmetric qscheme, got {qscheme!r}"
                + (
                    "; use PerChannelMinMaxObserver for per-channel qparams"
                    if not self._per_channel
                    else "; use MinMaxObserver for per-tensor qparams"
                )
            )
        if not isinstance(reduce_range, (bool, np.bool_)):
            raise TypeError(f"reduce_range must be a bool, got {reduce_range!r}")
        self.reduce_range = bool(reduce_range)
        self.symmetric = self.qscheme.endswith("symmetric")
        if self.symmetric and self.reduce_range and self.dtype == "quint8":
            raise ValueError(
                "reduce_range=True is not supported with symmetric quint8 quantization "
                "(torch raises too): use qint8, or reduce_range=False"
            )
        self.quant_min, self.quant_max, self.has_customized_qrange = _resolve_range(
            self.dtype, self.reduce_range, quant_min, quant_max
        )
        try:
            eps32 = _F32(eps)
        except (TypeError, ValueError):
            raise TypeError(f"eps must be a positive float, got {eps!r}") from None
        if not (np.isfinite(eps32) and eps32 > 0):
            raise ValueError(f"eps must be a positive finite float, got {eps!r}")
        self.eps = eps32
        self.nonfinite = _norm_name(nonfinite, "nonfinite policy", _NONFINITE)
        if self._moving:
            c = averaging_constant
            if isinstance(c, bool) or not isinstance(c, (int, float, np.floating, np.integer)):
                raise TypeError(f"averaging_constant must be a float in (0, 1], got {c!r}")
            if not 0.0 < float(c) <= 1.0:
                raise ValueError(f"averaging_constant must be in (0, 1], got {c!r}")
            self.averaging_constant = float(c)
        if self._per_channel:
            if isinstance(ch_axis, bool) or not isinstance(ch_axis, (int, np.integer)):
                raise TypeError(f"ch_axis must be an int, got {ch_axis!r}")
            self.ch_axis = int(ch_axis)
        #: A :class:`nbqat.distributed.ProcessGroup` (or None): batch statistics are combined
        #: over its ranks before every update (:func:`nbqat.distributed.sync_observers`).
        self.process_group: Any = None
        self.reset_min_max_vals()

    # -- factories ---------------------------------------------------------------------------
    @classmethod
    def with_args(cls, **kwargs: Any) -> _PartialWrapper:
        """A factory of this observer with these keyword arguments (torch's ``with_args``).

        Parameters
        ----------
        **kwargs
            Constructor arguments; the factory's own ``with_args`` adds or overrides more.

        Returns
        -------
        callable
            Calling it (with optional further keyword arguments) builds a new observer.
        """
        return _with_args(cls, **kwargs)

    # -- state --------------------------------------------------------------------------------
    @property
    def min_val(self) -> np.ndarray:
        """Running minimum, float32, shape () per tensor or (C,) per channel ((0,) unset)."""
        return self._min

    @property
    def max_val(self) -> np.ndarray:
        """Running maximum, float32, shape () per tensor or (C,) per channel ((0,) unset)."""
        return self._max

    def reset_min_max_vals(self) -> None:
        """Forget the statistics (per tensor: +Inf/-Inf; per channel: empty arrays)."""
        self._min: np.ndarray
        self._max: np.ndarray
        if self._per_channel:
            self._min = np.empty(0, _F32)
            self._max = np.empty(0, _F32)
        else:
            self._min = np.array(np.inf, _F32)
            self._max = np.array(-np.inf, _F32)

    # -- observing ----------------------------------------------------------------------------
    def __call__(self, x: Any) -> Any:
        return self.forward(x)

    def forward(self, x: Any) -> Any:
        """Observe a batch and return it unchanged.

        Parameters
        ----------
        x : ndarray or CUDA device array, float16/float32/float64, any shape
            float16/float64 data is observed as ``x.astype(float32)`` (torch's ``x.to(float32)``).
            An empty batch is returned without observing (torch's rule).

        Returns
        -------
        x : the same object

        Raises
        ------
        TypeError
            Non-array or non-float input.
        ValueError
            ``ch_axis`` out of range, the channel count differs from the observed one, or (with
            ``nonfinite="raise"``) the batch holds NaN/Inf. The state is unchanged on any error.
        """
        who = f"{type(self).__name__}.forward"
        is_cuda = _check_input(x, who)
        shape = tuple(x.shape)
        size = int(np.prod(shape, dtype=np.int64))
        axis = None
        if self._per_channel:
            nd = len(shape)
            if nd == 0:
                raise ValueError(
                    f"{who}: per-channel observation needs x.ndim >= 1, got a 0-d array"
                )
            if not -nd <= self.ch_axis < nd:
                raise ValueError(
                    f"{who}: ch_axis={self.ch_axis} is out of range for x of shape {shape} "
                    f"(valid: {-nd}..{nd - 1})"
                )
            axis = self.ch_axis % nd
            c = shape[axis]
            if self._min.size and self._min.size != c:
                raise ValueError(
                    f"{who}: x has {c} channels along ch_axis={self.ch_axis} but the observer "
                    f"has seen {self._min.size}; call reset_min_max_vals() to start over"
                )
        pg = self.process_group
        synced = pg is not None and pg.distributed
        if size == 0 and not synced:
            return x
        stats: tuple[np.ndarray, ...]
        if size == 0:  # still take part in the ranks' collective, with nothing observed
            c = 1 if axis is None else shape[axis]
            z = np.zeros(c, np.int64)
            stats = (np.full(c, np.inf, _F32), np.full(c, -np.inf, _F32), z, z, z)
        elif is_cuda:
            stats = _stats_cuda(x, axis)
        elif axis is None:
            stats = _stats_cpu_tensor(x)
        else:
            stats = _stats_cpu_channel(x, axis)
        if synced:  # the global batch's statistics, identical on every rank
            stats = pg.combine_minmax_stats(stats, who)
            seen_any = np.any(np.isfinite(stats[0])) or any(np.any(n) for n in stats[2:])
            if not seen_any:  # every rank's batch was empty: as one process, observe nothing
                return x
        fmin, fmax, nnan, npinf, nninf = stats
        cur_min, cur_max = self._apply_policy(who, fmin, fmax, nnan, npinf, nninf)
        self._update(cur_min, cur_max)
        return x

    def _apply_policy(self, who, fmin, fmax, nnan, npinf, nninf):
        """Batch (C,) min/max under the non-finite policy (raises before any state change)."""
        t_nan, t_pinf, t_ninf = int(nnan.sum()), int(npinf.sum()), int(nninf.sum())
        if t_nan + t_pinf + t_ninf == 0:
            return fmin, fmax
        if self.nonfinite == "raise":
            raise ValueError(
                f"{who}: the batch holds {t_nan} NaN, {t_pinf} +Inf and {t_ninf} -Inf values; "
                "the observer state is unchanged. Fix the input, or construct the observer with "
                "nonfinite='ignore' (skip them) or nonfinite='propagate' (torch's behaviour)"
            )
        if self.nonfinite == "ignore":
            return fmin, fmax  # finite-only; channels without a finite value are (+inf, -inf)
        # propagate: what torch.aminmax gives on the float32 data
        cur_min = np.where(nninf > 0, _F32(-np.inf), fmin).astype(_F32)
        cur_max = np.where(npinf > 0, _F32(np.inf), fmax).astype(_F32)
        cur_min = np.where(nnan > 0, _F32(np.nan), cur_min).astype(_F32)
        cur_max = np.where(nnan > 0, _F32(np.nan), cur_max).astype(_F32)
        return cur_min, cur_max

    def _update(self, cur_min: np.ndarray, cur_max: np.ndarray) -> None:
        """Fold a batch's (C,) min/max into the state (torch's expressions, in float32)."""
        cur_min = cur_min.astype(_F32, copy=False)
        cur_max = cur_max.astype(_F32, copy=False)
        if self._per_channel:
            old_min = self._min if self._min.size else np.full(cur_min.shape, np.inf, _F32)
            old_max = self._max if self._max.size else np.full(cur_max.shape, -np.inf, _F32)
        else:
            old_min = self._min.reshape(1)
            old_max = self._max.reshape(1)
        empty = cur_min > cur_max  # only (+inf, -inf): no finite value seen ("ignore")
        unset = (old_min == np.inf) & (old_max == -np.inf)
        if self._moving:
            c = _F32(self.averaging_constant)
            with np.errstate(invalid="ignore", over="ignore"):
                new_min = old_min + c * (cur_min - old_min)
                new_max = old_max + c * (cur_max - old_max)
            new_min = np.where(unset, cur_min, new_min)
            new_max = np.where(unset, cur_max, new_max)
        else:
            new_min = np.minimum(cur_min, old_min)  # NaN-propagating, as torch.min
            new_max = np.maximum(cur_max, old_max)
        new_min = np.where(empty, old_min, new_min).astype(_F32)
        new_max = np.where(empty, old_max, new_max).astype(_F32)
        if self._per_channel:
            self._min, self._max = new_min, new_max
        else:
            self._min, self._max = new_min.reshape(()), new_max.reshape(())

    # -- private helpers of nbqat.FakeQuantize's fast path ------------------------------------
    def _symmetric_zero_point(self) -> int:
        """The zero point of a symmetric qscheme (see :meth:`calculate_qparams`)."""
        if _DTYPES[self.dtype][2]:
            return 0
        if self.has_customized_qrange or self.dtype != "quint8":
            return (self.quant_min + self.quant_max) // 2
        return 128

    # -- qparams ------------------------------------------------------------------------------
    def calculate_qparams(self) -> tuple[np.ndarray, np.ndarray]:
        """Scale and zero point from the running min/max (torch's ``_calculate_qparams``).

        Returns
        -------
        scale : float32 ndarray, shape (1,) per tensor or (C,) per channel
        zero_point : int32 ndarray, same shape

        Warns
        -----
        UserWarning
            Nothing observed yet: returns ``([1.0], [0])`` as torch does (per channel too).
            Per channel, channels that never saw a finite value (``nonfinite="ignore"``) get
            scale 1.0 and zero point 0.
        RuntimeWarning
            The state holds NaN (``nonfinite="propagate"``): the result is torch's (NaN scale).

        Notes
        -----
        In float32, with ``min_neg = min(min_val, 0)``, ``max_pos = max(max_val, 0)``::

            symmetric: scale = max(max(-min_neg, max_pos) / ((qmax - qmin) / 2), eps)
                       zp = 0 (signed), 128 (quint8, default range), (qmin + qmax) // 2
                       (unsigned with a custom range)
            affine:    scale = max((max_pos - min_neg) / (qmax - qmin), eps)
                       zp = clamp(qmin - rint(min_neg / scale), qmin, qmax)

        The int conversion of ``rint(min_neg / scale)`` and the int32 subtraction follow torch
        on x86 (NaN or out-of-range converts to INT32_MIN; the subtraction wraps).

        References
        ----------
        ``torch/ao/quantization/observer.py``:
        ``UniformQuantizationObserverBase._calculate_qparams``.
        """
        return self._qparams(self._min, self._max)

    def _qparams(self, min_val: np.ndarray, max_val: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        mn = np.asarray(min_val, _F32).reshape(-1)
        mx = np.asarray(max_val, _F32).reshape(-1)
        unset = (mn == np.inf) & (mx == -np.inf)
        if mn.size == 0 or (not self._per_channel and bool(unset[0])):
            warnings.warn(
                "must run observer before calling calculate_qparams. Returning default values.",
                UserWarning,
                stacklevel=3,
            )
            return np.array([1.0], _F32), np.array([0], np.int32)
        if unset.any():
            warnings.warn(
                f"{int(unset.sum())} channel(s) never saw a finite value: their scale is 1.0 and "
                "zero point 0",
                UserWarning,
                stacklevel=3,
            )
            mn = np.where(unset, _F32(0), mn)
            mx = np.where(unset, _F32(0), mx)
        if np.isnan(mn).any() or np.isnan(mx).any():
            warnings.warn(
                "the observer state holds NaN (nonfinite='propagate'): the scale is NaN, as in "
                "torch. Use nonfinite='raise' or 'ignore' to keep the statistics usable.",
                RuntimeWarning,
                stacklevel=3,
            )
        qmin, qmax = self.quant_min, self.quant_max
        zero = np.zeros_like(mn)
        min_neg = np.minimum(mn, zero)
        max_pos = np.maximum(mx, zero)
        with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
            if self.symmetric:
                max_pos = np.maximum(-min_neg, max_pos)
                scale = max_pos / _F32(float(qmax - qmin) / 2)
                scale = np.maximum(scale, self.eps)
                signed = _DTYPES[self.dtype][2]
                if signed:
                    zp = np.zeros(mn.shape, np.int64)
                elif self.has_customized_qrange or self.dtype != "quint8":
                    zp = np.full(mn.shape, (qmin + qmax) // 2, np.int64)
                else:
                    zp = np.full(mn.shape, 128, np.int64)
            else:
                scale = (max_pos - min_neg) / _F32(float(qmax - qmin))
                scale = np.maximum(scale, self.eps)
                r = np.rint(min_neg / scale)  # float32, half to even (torch.round)
                ok = np.isfinite(r) & (r >= -(2.0**31)) & (r < 2.0**31)
                ri = np.where(ok, r, _F32(-(2.0**31))).astype(np.int64)  # x86 cvt: INT32_MIN
                z = np.int64(qmin) - ri
                z = (z + 2**31) % 2**32 - 2**31  # int32 wrap-around, as torch's int32 tensor op
                zp = np.clip(z, qmin, qmax)
        if unset.any():
            scale = np.where(unset, _F32(1.0), scale)
            zp = np.where(unset, 0, zp)
        return scale.astype(_F32), zp.astype(np.int32)

    # -- merging, serialization ---------------------------------------------------------------
    def merge(self, other: _MinMaxBase) -> _MinMaxBase:
        """Combine another observer's statistics into this one (in place; returns self).

        For :class:`MinMaxObserver` / :class:`PerChannelMinMaxObserver` the result is exact:
        the min/max of everything both observers saw, as if one observer had seen all batches
        (data-parallel calibration). For the moving-average observers there is no exact merge:
        the two running estimates are averaged (``a + 0.5 * (b - a)`` in float32), which is the
        estimate of workers that saw equally many batches from the same distribution. A side
        that has observed nothing (or, per channel, a channel without a finite value) is ignored.

        Parameters
        ----------
        other : observer of the same class and configuration
            Left unchanged.

        Returns
        -------
        self

        Raises
        ------
        TypeError
            ``other`` is not an observer of the same class.
        ValueError
            Different configuration (dtype, qscheme, range, ch_axis) or channel count.
        """
        if type(other) is not type(self):
            raise TypeError(
                f"merge needs another {type(self).__name__}, got {type(other).__name__}"
            )
        mine: tuple[object, ...] = (self.dtype, self.qscheme, self.quant_min, self.quant_max)
        theirs: tuple[object, ...] = (other.dtype, other.qscheme, other.quant_min, other.quant_max)
        if self._per_channel:
            mine += (self.ch_axis,)
            theirs += (other.ch_axis,)
        if mine != theirs:
            raise ValueError(
                f"cannot merge observers with different configurations: {mine} vs {theirs}"
            )
        if self._per_channel:
            if other._min.size == 0:
                return self
            if self._min.size == 0:
                self._min, self._max = other._min.copy(), other._max.copy()
                return self
            if self._min.size != other._min.size:
                raise ValueError(
                    f"cannot merge {self._min.size} channels with {other._min.size} channels"
                )
        a_min, a_max = self._min.reshape(-1), self._max.reshape(-1)
        b_min, b_max = other._min.reshape(-1), other._max.reshape(-1)
        a_unset = (a_min == np.inf) & (a_max == -np.inf)
        b_unset = (b_min == np.inf) & (b_max == -np.inf)
        if self._moving:
            h = _F32(0.5)
            with np.errstate(invalid="ignore", over="ignore"):
                new_min = a_min + h * (b_min - a_min)
                new_max = a_max + h * (b_max - a_max)
        else:
            new_min = np.minimum(a_min, b_min)
            new_max = np.maximum(a_max, b_max)
        new_min = np.where(b_unset, a_min, np.where(a_unset, b_min, new_min)).astype(_F32)
        new_max = np.where(b_unset, a_max, np.where(a_unset, b_max, new_max)).astype(_F32)
        self._min = new_min.reshape(self._min.shape)
        self._max = new_max.reshape(self._max.shape)
        return self

    def state_dict(self) -> dict[str, np.ndarray]:
        """Copies of torch's buffers: ``eps`` (1,), ``min_val``/``max_val`` () or (C,)."""
        return {
            "eps": np.array([self.eps], _F32),
            "min_val": self._min.copy(),
            "max_val": self._max.copy(),
        }

    def load_state_dict(self, state: dict[str, Any], strict: bool = True) -> None:
        """Load ``state_dict()`` output (or torch's, converted with ``.numpy()``).

        Parameters
        ----------
        state : mapping with ``min_val`` and ``max_val`` (``eps`` optional)
        strict : bool, default True
            Reject keys other than ``eps``, ``min_val``, ``max_val``.

        Raises
        ------
        KeyError
            A required key is missing.
        ValueError
            Unexpected keys (strict), wrong shapes, min/max length mismatch, ``min_val > max_val``,
            or a non-positive eps. Nothing is changed on error.
        """
        if not hasattr(state, "keys"):
            raise TypeError(f"state must be a mapping (a state_dict()), got {type(state).__name__}")
        missing = [k for k in ("min_val", "max_val") if k not in state]
        if missing:
            raise KeyError(f"load_state_dict: missing key(s) {missing} (expected min_val, max_val)")
        extra = sorted(set(state) - {"eps", "min_val", "max_val"})
        if strict and extra:
            raise ValueError(f"load_state_dict: unexpected key(s) {extra} (pass strict=False)")
        try:
            mn = np.array(state["min_val"], dtype=_F32)
            mx = np.array(state["max_val"], dtype=_F32)
        except (TypeError, ValueError):
            raise ValueError("load_state_dict: min_val/max_val must be float arrays") from None
        if self._per_channel:
            if mn.ndim != 1 or mx.shape != mn.shape:
                raise ValueError(
                    "load_state_dict: per-channel min_val/max_val must be 1-D of equal length, "
                    f"got shapes {mn.shape} and {mx.shape}"
                )
        else:
            if mn.size != 1 or mx.size != 1 or mn.ndim > 1 or mx.ndim > 1:
                raise ValueError(
                    "load_state_dict: per-tensor min_val/max_val must have shape () or (1,), "
                    f"got {mn.shape} and {mx.shape}"
                )
            mn, mx = mn.reshape(()), mx.reshape(())
        unset = (mn == np.inf) & (mx == -np.inf)
        if np.any((mn > mx) & ~unset):
            raise ValueError("load_state_dict: min_val > max_val for some entries")
        eps = self.eps
        if "eps" in state:
            e = np.asarray(state["eps"], dtype=_F32).reshape(-1)
            if e.size != 1 or not (np.isfinite(e[0]) and e[0] > 0):
                raise ValueError(f"load_state_dict: eps must be one positive float, got {e}")
            eps = e[0]
        self._min, self._max, self.eps = mn, mx, _F32(eps)

    def _extra_repr(self) -> str:
        s = f"dtype={self.dtype}, qscheme={self.qscheme}, quant_min={self.quant_min}, "
        s += f"quant_max={self.quant_max}"
        if self._per_channel:
            s += f", ch_axis={self.ch_axis}"
        if self._moving:
            s += f", averaging_constant={self.averaging_constant}"
        return s + f", nonfinite={self.nonfinite!r}, min_val={self._min}, max_val={self._max}"

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._extra_repr()})"


class MinMaxObserver(_MinMaxBase):
    """Running minimum and maximum of every batch, per tensor (torch's ``MinMaxObserver``).

    Parameters
    ----------
    dtype : {"quint8", "qint8", "quint4", "qint4", "qint16", "qint32"}, default "quint8"
        Quantized dtype (``"torch.qint8"`` spellings accepted); sets the default range.
    qscheme : {"per_tensor_affine", "per_tensor_symmetric"}, default "per_tensor_affine"
    reduce_range : bool, default False
        Halve the range (qint8 [-64, 63], quint8 [0, 127]; a custom range ``// 2``).
    quant_min, quant_max : int, optional
        A custom range (both or neither); must contain 0 and fit the dtype.
    eps : float, default float32 epsilon
        Lower bound of the scale.
    nonfinite : {"raise", "ignore", "propagate"}, default "raise"
        What a NaN/Inf in a batch does (module docstring).

    Notes
    -----
    ``min_val = min(min_val, min(x))``, ``max_val = max(max_val, max(x))`` in float32;
    qparams as :meth:`calculate_qparams`.

    References
    ----------
    ``torch.ao.quantization.observer.MinMaxObserver`` (torch 2.13).
    """

    def __init__(
        self,
        dtype: str = "quint8",
        qscheme: str = "per_tensor_affine",
        reduce_range: bool = False,
        quant_min: int | None = None,
        quant_max: int | None = None,
        eps: float = EPS,
        nonfinite: str = "raise",
    ) -> None:
        super().__init__(
            dtype=dtype,
            qscheme=qscheme,
            reduce_range=reduce_range,
            quant_min=quant_min,
            quant_max=quant_max,
            eps=eps,
            nonfinite=nonfinite,
        )


class MovingAverageMinMaxObserver(_MinMaxBase):
    """Exponential moving average of each batch's min and max, per tensor.

    Parameters
    ----------
    averaging_constant : float in (0, 1], default 0.01
        ``c`` in ``min_val = min_val + c * (min(x) - min_val)`` (float32, torch's exact
        expression); the first batch sets min_val/max_val directly.
    dtype, qscheme, reduce_range, quant_min, quant_max, eps, nonfinite
        As :class:`MinMaxObserver`.

    References
    ----------
    ``torch.ao.quantization.observer.MovingAverageMinMaxObserver`` (torch 2.13).
    """

    _moving = True

    def __init__(
        self,
        averaging_constant: float = 0.01,
        dtype: str = "quint8",
        qscheme: str = "per_tensor_affine",
        reduce_range: bool = False,
        quant_min: int | None = None,
        quant_max: int | None = None,
        eps: float = EPS,
        nonfinite: str = "raise",
    ) -> None:
        super().__init__(
            dtype=dtype,
            qscheme=qscheme,
            reduce_range=reduce_range,
            quant_min=quant_min,
            quant_max=quant_max,
            eps=eps,
            nonfinite=nonfinite,
            averaging_constant=averaging_constant,
        )


class PerChannelMinMaxObserver(_MinMaxBase):
    """Running minimum and maximum per channel (reduced over every axis but ``ch_axis``).

    Parameters
    ----------
    ch_axis : int, default 0
        Channel axis (negative counts from the end); weights use 0, activations [B, C, ...] 1.
        The channel count is fixed by the first batch (until :meth:`reset_min_max_vals`).
    dtype : str, default "quint8"
    qscheme : {"per_channel_affine", "per_channel_symmetric"}, default "per_channel_affine"
    reduce_range, quant_min, quant_max, eps, nonfinite
        As :class:`MinMaxObserver`.

    References
    ----------
    ``torch.ao.quantization.observer.PerChannelMinMaxObserver`` (torch 2.13).
    """

    _per_channel = True

    def __init__(
        self,
        ch_axis: int = 0,
        dtype: str = "quint8",
        qscheme: str = "per_channel_affine",
        reduce_range: bool = False,
        quant_min: int | None = None,
        quant_max: int | None = None,
        eps: float = EPS,
        nonfinite: str = "raise",
    ) -> None:
        super().__init__(
            dtype=dtype,
            qscheme=qscheme,
            reduce_range=reduce_range,
            quant_min=quant_min,
            quant_max=quant_max,
            eps=eps,
            nonfinite=nonfinite,
            ch_axis=ch_axis,
        )


class MovingAveragePerChannelMinMaxObserver(_MinMaxBase):
    """Exponential moving average of each channel's min and max.

    Parameters
    ----------
    averaging_constant : float in (0, 1], default 0.01
    ch_axis : int, default 0
    dtype, qscheme, reduce_range, quant_min, quant_max, eps, nonfinite
        As :class:`PerChannelMinMaxObserver`.

    References
    ----------
    ``torch.ao.quantization.observer.MovingAveragePerChannelMinMaxObserver`` (torch 2.13).
    """

    _per_channel = True
    _moving = True

    def __init__(
        self,
        averaging_constant: float = 0.01,
        ch_axis: int = 0,
        dtype: str = "quint8",
        qscheme: str = "per_channel_affine",
        reduce_range: bool = False,
        quant_min: int | None = None,
        quant_max: int | None = None,
        eps: float = EPS,
        nonfinite: str = "raise",
    ) -> None:
        super().__init__(
            dtype=dtype,
            qscheme=qscheme,
            reduce_range=reduce_range,
            quant_min=quant_min,
            quant_max=quant_max,
            eps=eps,
            nonfinite=nonfinite,
            averaging_constant=averaging_constant,
            ch_axis=ch_axis,
        )
