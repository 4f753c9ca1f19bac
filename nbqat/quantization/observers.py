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

import math
from typing import Any

import numpy as np

from nbqat.quantization import _minmax_math as _mm
from nbqat.quantization import _observer_args as _args
from nbqat.quantization import _observer_stats as _st
from nbqat.quantization._observer_args import PartialWrapper as _PartialWrapper
from nbqat.quantization._observer_args import with_args as _with_args
from nbqat.quantization._observer_stats import check_input as _check_input

__all__ = [
    "MinMaxObserver",
    "MovingAverageMinMaxObserver",
    "MovingAveragePerChannelMinMaxObserver",
    "PerChannelMinMaxObserver",
]

_F32 = np.float32


class _MinMaxBase:
    """Shared machinery of every observer (configuration, qparams, state, policy).

    A subclass names its constructor's own leading arguments in :attr:`OWN_PARAMS` and checks
    them in :meth:`_configure_own`; the common ones
    (:data:`nbqat.quantization._observer_args.COMMON_PARAMS`)
    follow in torch's order, so ``inspect.signature(cls)`` is torch's.
    """

    _per_channel = False
    _moving = False
    #: The constructor's own leading arguments: (name, annotation, default), torch's order.
    OWN_PARAMS: tuple[tuple[str, Any, Any], ...] = ()
    #: The constructor's default ``qscheme``.
    DEFAULT_QSCHEME = "per_tensor_affine"
    __signature__ = _args.ConstructorSignature()
    # set by _args.check_common (the common arguments) and _configure_own
    dtype: str
    qscheme: str
    reduce_range: bool
    symmetric: bool
    quant_min: int
    quant_max: int
    has_customized_qrange: bool
    eps: np.float32
    nonfinite: str
    averaging_constant: float
    ch_axis: int

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        a = _args.bind_arguments(type(self), args, kwargs)
        self._configure_own(a)
        common = [a[name] for name, _, _ in _args.COMMON_PARAMS]
        vars(self).update(_args.check_common(type(self).__name__, self._per_channel, *common))
        #: A :class:`nbqat.distributed.ProcessGroup` (or None): batch statistics are combined
        #: over its ranks before every update (:func:`nbqat.distributed.sync_observers`).
        self.process_group: Any = None
        self.reset_min_max_vals()

    def _configure_own(self, a: dict[str, Any]) -> None:
        """Check and keep the class's own constructor arguments (``a``: every argument)."""
        if self._moving:
            c = a["averaging_constant"]
            if isinstance(c, bool) or not isinstance(c, (int, float, np.floating, np.integer)):
                raise TypeError(f"averaging_constant must be a float in (0, 1], got {c!r}")
            if not 0.0 < float(c) <= 1.0:
                raise ValueError(f"averaging_constant must be in (0, 1], got {c!r}")
            self.averaging_constant = float(c)
        if self._per_channel:
            ch_axis = a["ch_axis"]
            if isinstance(ch_axis, bool) or not isinstance(ch_axis, (int, np.integer)):
                raise TypeError(f"ch_axis must be an int, got {ch_axis!r}")
            self.ch_axis = int(ch_axis)

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
        x : ndarray, CUDA device array or array-like, float16/float32/float64, any shape
            float16/float64 data is observed as ``x.astype(float32)`` (torch's ``x.to(float32)``);
            an array-like (a torch CPU tensor, anything with ``__array__`` or ``__dlpack__``)
            as ``np.asarray(x)``. An empty batch is returned without observing (torch's rule).

        Returns
        -------
        x : the same object

        Raises
        ------
        TypeError
            Non-array or non-float input (a tensor that requires grad: pass ``x.detach()``).
        ValueError
            ``ch_axis`` out of range, the channel count differs from the observed one, or (with
            ``nonfinite="raise"``) the batch holds NaN/Inf. The state is unchanged on any error.
        """
        self._observe(x)
        return x

    def _observe(self, x: Any) -> Any:
        """:meth:`forward`'s work; returns the batch as an array (:func:`_check_input`)."""
        who = f"{type(self).__name__}.forward"
        a, is_cuda = _check_input(x, who)
        axis = None
        if self._per_channel:
            axis = _st.channel_axis(tuple(a.shape), self.ch_axis, self._min.size, who)
        pg = self.process_group
        synced = pg is not None and pg.distributed
        if math.prod(a.shape) == 0 and not synced:
            return a
        # empty: still take part in the ranks' collective, with nothing observed
        stats = _st.batch_stats(a, is_cuda, axis)
        if synced:  # the global batch's statistics, identical on every rank
            stats = pg.combine_minmax_stats(stats, who, self._sync_config())
            seen_any = np.any(np.isfinite(stats[0])) or any(np.any(n) for n in stats[2:])
            if not seen_any:  # every rank's batch was empty: as one process, observe nothing
                return a
        fmin, fmax, nnan, npinf, nninf = stats
        cur_min, cur_max = self._apply_policy(who, fmin, fmax, nnan, npinf, nninf)
        self._update(cur_min, cur_max)
        return a

    def _sync_config(self) -> tuple:
        """The settings that shape this observer's collectives after the statistics (a
        histogram's bins, a key grid's mantissa bits, the MSE's exact-values bound)."""
        return tuple(getattr(self, k, None) for k in ("bins", "mantissa_bits", "max_exact"))

    def _apply_policy(self, who, fmin, fmax, nnan, npinf, nninf):
        """Batch (C,) min/max under the non-finite policy (raises before any state change)."""
        return _mm.apply_policy(self.nonfinite, who, fmin, fmax, nnan, npinf, nninf)

    def _update(self, cur_min: np.ndarray, cur_max: np.ndarray) -> None:
        """Fold a batch's (C,) min/max into the state (torch's expressions, in float32)."""
        if self._per_channel:
            old_min = self._min if self._min.size else np.full(cur_min.shape, np.inf, _F32)
            old_max = self._max if self._max.size else np.full(cur_max.shape, -np.inf, _F32)
        else:
            old_min, old_max = self._min.reshape(1), self._max.reshape(1)
        c = self.averaging_constant if self._moving else None
        new_min, new_max = _mm.fold_batch(old_min, old_max, cur_min, cur_max, c)
        if self._per_channel:  # fold_batch's (C,) float32 results: the state's own shapes
            self._min, self._max = new_min, new_max
        else:
            self._min, self._max = new_min.reshape(()), new_max.reshape(())

    # -- the state of nbqat.FakeQuantize's fused path ----------------------------------------
    def set_min_max(self, min_val: Any, max_val: Any) -> None:
        """Replace the running minimum and maximum (the observer state).

        The interface of :class:`nbqat.FakeQuantize`'s fused path, which updates the state in
        its own compiled pass (bit for bit as :meth:`forward`) and writes it back here.

        Parameters
        ----------
        min_val, max_val : array_like of float
            Per tensor: shape () or (1,) each; per channel: (C,) each. Stored as
            float32 copies. ``(+inf, -inf)`` marks an entry as unset.

        Raises
        ------
        ValueError
            Wrong shapes, ``min_val > max_val``, or NaN / Inf (other than the unset pair) under
            ``nonfinite="raise"`` or ``"ignore"`` (as :meth:`load_state_dict`); nothing is
            changed.
        """
        mn, mx = np.array(min_val, dtype=_F32), np.array(max_val, dtype=_F32)
        mn, mx = _mm.check_min_max_shapes(mn, mx, self._per_channel, "set_min_max")
        _mm.check_min_max_values(mn, mx, self.nonfinite, "set_min_max", "set such values")
        self._min, self._max = mn, mx

    def symmetric_zero_point(self) -> int:
        """The zero point of a symmetric qscheme: 0 for signed dtypes, 128 for quint8 with its
        default range, ``(quant_min + quant_max) // 2`` otherwise (torch's rule).

        Returns
        -------
        int
        """
        return _mm.symmetric_zero_point(
            self.dtype, self.has_customized_qrange, self.quant_min, self.quant_max
        )

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
        on x86 (NaN or out-of-range converts to INT32_MIN; the subtraction wraps). A finite
        affine range whose width ``max_pos - min_neg`` overflows float32 (e.g. ``[-3e38, 3e38]``)
        gets the qparams of the range halved with the scale doubled back (exact powers of two:
        the float32 rounding of the true width / (qmax - qmin)); torch returns scale ``inf``.

        References
        ----------
        ``torch/ao/quantization/observer.py``:
        ``UniformQuantizationObserverBase._calculate_qparams``.
        """
        return self._qparams(self._min, self._max)

    def _qparams(self, min_val: np.ndarray, max_val: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        zp = self.symmetric_zero_point() if self.symmetric else None
        qmin, qmax = self.quant_min, self.quant_max
        return _mm.qparams(min_val, max_val, qmin, qmax, self.eps, zp, self._per_channel)

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
            Different configuration or channel count; NaN / Inf ``nonfinite`` keeps out.
        """
        self._check_mergeable(other)
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
        a0, a1, b0, b1 = (v.reshape(-1) for v in (self._min, self._max, other._min, other._max))
        new_min, new_max = _mm.merge_min_max(a0, a1, b0, b1, self._moving, self.nonfinite)
        self._min = new_min.reshape(self._min.shape)
        self._max = new_max.reshape(self._max.shape)
        return self

    def _merge_key(self) -> tuple[object, ...]:
        """The configuration two observers must share to merge."""
        key: tuple[object, ...] = (self.dtype, self.qscheme, self.quant_min, self.quant_max)
        return key + ((self.ch_axis,) if self._per_channel else ())

    def _check_mergeable(self, other: Any) -> None:
        if type(other) is not type(self):
            raise TypeError(
                f"merge needs another {type(self).__name__}, got {type(other).__name__}"
            )
        mine, theirs = self._merge_key(), other._merge_key()
        if mine != theirs:
            raise ValueError(
                f"cannot merge observers with different configurations: {mine} vs {theirs}"
            )

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
            NaN or Inf (other than the unset ``(+inf, -inf)``) unless ``nonfinite="propagate"``,
            or a non-positive eps. Nothing is changed on error.
        """
        mn, mx, eps = _mm.parse_min_max_state(
            state, strict, self._per_channel, self.eps, self.nonfinite
        )
        self._min, self._max, self.eps = mn, mx, eps

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
    OWN_PARAMS = (("averaging_constant", float, 0.01),)


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
    ``torch.ao.quantization.observer.PerChannelMinMaxObserver`` (torch 2.13); nbqat reduces
    in place for any ``ch_axis`` (no transposed copy of ``x``).
    """

    _per_channel = True
    OWN_PARAMS = (("ch_axis", int, 0),)
    DEFAULT_QSCHEME = "per_channel_affine"


class MovingAveragePerChannelMinMaxObserver(_MinMaxBase):
    """Exponential moving average of each channel's min and max.

    Parameters
    ----------
    averaging_constant : float in (0, 1], default 0.01
    ch_axis : int, default 0
    dtype, qscheme, reduce_range, quant_min, quant_max, eps, nonfinite
        As :class:`PerChannelMinMaxObserver` (per-channel qschemes).

    References
    ----------
    ``torch.ao.quantization.observer.MovingAveragePerChannelMinMaxObserver`` (torch 2.13):
    :class:`MovingAverageMinMaxObserver`'s average, channel by channel.
    """

    _per_channel = True
    _moving = True
    OWN_PARAMS = (("averaging_constant", float, 0.01), ("ch_axis", int, 0))
    DEFAULT_QSCHEME = "per_channel_affine"
