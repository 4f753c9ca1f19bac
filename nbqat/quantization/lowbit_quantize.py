"""Low-bit quantizer modules (issue 30): grouped int4 weights, per-token dynamic activations
and float8, in the FakeQuantize family (torch's phases, ``with_args``, ``forward`` leaving the
STE mask in ``ctx``, ``backward(grad, ctx)``).

* :class:`GroupFakeQuantize` -- weights: its observer (:class:`GroupAffineObserver`) runs
  :func:`~nbqat.choose_qparams_affine` per group of ``group_size`` input features (symmetric
  int4 ``[-8, 7]`` by default), the forward is :func:`~nbqat.fake_quantize_affine_cachemask`
  and the backward the straight-through estimator. torchao's ``Int8DynActInt4WeightQATLinear``
  weight (``IntxFakeQuantizeConfig(int4, group_size=G, is_symmetric=True)``). A weight whose
  input width ``K`` is smaller than ``G`` or not a multiple of it is quantized per output
  channel instead (``block_size = (1, K)``, same formula);
  :attr:`GroupFakeQuantize.per_channel_fallback` says so after the first forward.
* :class:`PerTokenFakeQuantize` -- activations: per token (last axis) asymmetric int8
  ``[-128, 127]`` with qparams computed from every batch (dynamic, no statistics), torchao's
  8da4w activation (``eps = finfo(float32).eps``).
* :class:`Float8FakeQuantize` -- float8 (e4m3fn / e5m2) with a dynamic scale per row (weights)
  or per tensor (activations): :func:`~nbqat.choose_scale_float8` and
  :func:`~nbqat.fake_quantize_float8_cachemask`.

All three recompute their qparams at every forward while the observer is enabled (as
torchao's dynamic quantizers) and keep the last ones when it is disabled (frozen). They take
float32 input only. The backward is the STE mask (``grad * mask``); torchao's
``IntxFakeQuantizer`` also lets autograd through the weight scale's ``amax`` (one extra term
at each group's largest element), which QAT practice (and nbqat) leaves out.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from nbqat.quantization import _validate_state as VS
from nbqat.quantization import fake_quant as _fq
from nbqat.quantization._observer_stats import global_sample
from nbqat.quantization._quantizer_base import _CACHED, _QuantizerPhases
from nbqat.quantization.affine import choose_qparams_affine, fake_quantize_affine_cachemask
from nbqat.quantization.float8 import choose_scale_float8, fake_quantize_float8_cachemask

__all__ = [
    "Float8FakeQuantize", "GroupAffineObserver", "GroupFakeQuantize", "PerTokenFakeQuantize",
]  # fmt: skip

_F32 = np.float32
#: torch.finfo(torch.float32).eps: torchao's eps of the 8da4w per-token activation qparams.
EPS_TOKEN = float(np.finfo(np.float32).eps)


def check_group_size(group_size: Any, what: str = "group_size") -> int:
    """``group_size`` as a positive int (TypeError / ValueError naming ``what``)."""
    if isinstance(group_size, bool) or not isinstance(group_size, (int, np.integer)):
        raise TypeError(f"{what} must be a positive int, got {group_size!r}")
    if int(group_size) < 1:
        raise ValueError(f"{what} must be a positive int, got {group_size}")
    return int(group_size)


def group_block(shape: tuple[int, ...], group_size: int) -> tuple[tuple[int, ...], bool]:
    """The ``block_size`` of a weight ``shape`` (..., K) and whether it is per group.

    Returns
    -------
    block_size : tuple of int
        ``(1, ..., 1, G)`` when ``G <= K`` and ``K % G == 0``, else ``(1, ..., 1, K)``
        (per output channel).
    grouped : bool
    """
    k = int(shape[-1])
    grouped = group_size <= k and k % group_size == 0
    return (1,) * (len(shape) - 1) + ((group_size if grouped else k),), grouped


class _LowBitBase(_QuantizerPhases):
    """What the three quantizers share: flags, ctx, the STE backward and the state dict."""

    learnable = False
    #: LSQ (``QATConfig.learnable_scales``) is not offered for these quantizers.
    supports_lsq = False
    is_per_channel = False
    ch_axis: int | None = None
    #: nbqat.distributed.sync_observers' hook: a per-tensor float8 scale is the global batch's;
    #: per-token and per-row qparams are row-local (the weights the same on every rank).
    process_group: Any = None
    _FLAG_KEYS = {k: k for k in ("fake_quant_enabled", "observer_enabled")}
    _OPTIONAL: tuple[str, ...] = ()  # further state-dict keys (GroupFakeQuantize's block_size)

    def _init_flags(self) -> None:
        self.observer_enabled = True
        self.fake_quant_enabled = True
        self.ctx: Any = None
        self._ran = False
        self.scale: np.ndarray = np.ones(1, _F32)
        self.zero_point: np.ndarray = np.zeros(1, np.int32)

    @staticmethod
    def _x32(x: Any, who: str) -> np.ndarray:
        a = np.asarray(x)
        if a.dtype != np.float32:
            raise TypeError(
                f"{who} takes float32 input (nbqat's low-bit primitives are float32), got "
                f"{a.dtype}: build the model with dtype=np.float32"
            )
        return a

    def _done(self, x: Any, y: Any, mask: Any) -> Any:
        self.ctx = mask
        self._ran = True
        return y if mask is not None else x

    def backward(self, grad_y: Any, ctx: Any = _CACHED, *, out: Any = None) -> Any:
        """Straight-through estimator: ``grad_x = grad_y * mask``.

        Parameters
        ----------
        grad_y : float array of the forward input's shape
        ctx : bool ndarray or None, optional
            A mask saved from :attr:`ctx`; default the last forward's (None: a copy).
        out : array, optional
            Preallocated result (``out=grad_y`` works in place).

        Returns
        -------
        grad_x : array like ``grad_y``
        """
        return _fq.fake_quantize_backward(grad_y, self._saved_ctx(ctx), out=out)

    def state_dict(self) -> dict[str, np.ndarray]:
        """Flags, ``scale`` and ``zero_point`` (the last qparams)."""
        return {
            "fake_quant_enabled": np.array([int(self.fake_quant_enabled)], np.uint8),
            "observer_enabled": np.array([int(self.observer_enabled)], np.uint8),
            "scale": np.asarray(self.scale, _F32).copy(),
            "zero_point": np.asarray(self.zero_point, np.int32).copy(),
        }

    def load_state_dict(self, state: dict[str, Any], strict: bool = True) -> None:
        """Load :meth:`state_dict` output, checked whole before anything changes
        (:func:`~nbqat.quantization._validate_state.check_lowbit_state`: KeyError for a
        missing key, ValueError for an unexpected one with ``strict`` or a bad value)."""
        flags, s, z = VS.check_lowbit_state(state, strict, type(self).__name__, self._OPTIONAL)
        self._set_state(s, z)
        self.fake_quant_enabled = flags["fake_quant_enabled"]
        self.observer_enabled = flags["observer_enabled"]

    def _set_state(self, scale: np.ndarray, zero_point: np.ndarray) -> None:
        self.scale, self.zero_point = scale, zero_point


class GroupAffineObserver:
    """Per-group weight statistics: :func:`~nbqat.choose_qparams_affine` of the last tensor.

    Parameters
    ----------
    group_size : int
        Input features per group (``G``); a weight whose last axis ``K`` is smaller or not a
        multiple of ``G`` gets one group per row (per channel).
    quant_min, quant_max : int, default -8, 7
    mapping_type : {"symmetric", "asymmetric"}, default "symmetric"
    eps : float, optional
        Smallest scale (default ``finfo(float32).smallest_normal``, torchao's for weights).

    Attributes
    ----------
    block_size : tuple of int or None
        Of the last observed tensor.
    per_channel_fallback : bool or None
        True when the last tensor was quantized per channel (``K`` not a multiple of ``G``).
    """

    #: nbqat.distributed.sync_observers' hook: the weights are the same on every rank.
    process_group: Any = None

    def __init__(
        self,
        group_size: int,
        quant_min: int = -8,
        quant_max: int = 7,
        mapping_type: str = "symmetric",
        eps: float | None = None,
    ) -> None:
        self.group_size = check_group_size(group_size)
        self.quant_min, self.quant_max = int(quant_min), int(quant_max)
        self.mapping_type, self.eps = mapping_type, eps
        self.block_size: tuple[int, ...] | None = None
        self.per_channel_fallback: bool | None = None
        self._qparams: tuple[np.ndarray, np.ndarray] | None = None

    def __call__(self, x: np.ndarray) -> np.ndarray:
        """Compute the per-group qparams of ``x`` (returned unchanged)."""
        block, grouped = group_block(tuple(np.shape(x)), self.group_size)
        s, z = choose_qparams_affine(
            x, self.mapping_type, block, self.quant_min, self.quant_max, eps=self.eps
        )
        grid = tuple(d // b for d, b in zip(np.shape(x), block, strict=True))
        self._qparams = (np.asarray(s, _F32).reshape(grid), np.asarray(z, np.int32).reshape(grid))
        self.block_size, self.per_channel_fallback = block, not grouped
        return x

    def calculate_qparams(self) -> tuple[np.ndarray, np.ndarray]:
        """``(scale, zero_point)`` of the last tensor, shaped ``x.shape // block_size``."""
        if self._qparams is None:
            raise RuntimeError("GroupAffineObserver: observe a tensor first")
        return self._qparams


class GroupFakeQuantize(_LowBitBase):
    """Grouped (block-wise) integer fake quantization of weights (int4 by default).

    Parameters
    ----------
    group_size : int
        Input features sharing one scale (``G``; per channel where ``K % G != 0`` or
        ``K < G``).
    observer : type, default GroupAffineObserver
        The observer class, built as ``observer(group_size, **observer_kwargs)`` (torch's
        ``FakeQuantize(observer, **observer_kwargs)`` pattern).
    **observer_kwargs
        The observer's keywords: ``quant_min``, ``quant_max`` (default -8, 7: int4 signed),
        ``mapping_type`` (default "symmetric"), ``eps`` (default torchao's for weights,
        ``2**-126``); see :class:`GroupAffineObserver`.

    Attributes
    ----------
    activation_post_process : GroupAffineObserver
    scale : float32 ndarray (N, K // G)
    zero_point : int32 ndarray (N, K // G)
        0 for symmetric signed ranges.
    block_size : tuple of int or None
        ``(1, G)`` or ``(1, K)`` once a forward has run.
    per_channel_fallback : bool or None
    dtype, qscheme : str
        ``"qint4"`` (``"qint8"`` ... for other ranges), ``"per_group_symmetric"`` /
        ``"per_group_affine"``.
    """

    def __init__(
        self, group_size: int, observer: Any = GroupAffineObserver, **observer_kwargs: Any
    ) -> None:
        obs = observer(group_size, **observer_kwargs)
        self.activation_post_process = obs  # type: ignore[assignment]
        self.group_size = obs.group_size
        self.quant_min, self.quant_max = obs.quant_min, obs.quant_max
        bits = int(np.ceil(np.log2(self.quant_max - self.quant_min + 1)))
        self.dtype = f"q{'u' if self.quant_min >= 0 else ''}int{bits}"
        kind = "symmetric" if str(obs.mapping_type).lower() == "symmetric" else "affine"
        self.qscheme = f"per_group_{kind}"
        self.block_size: tuple[int, ...] | None = None
        self._init_flags()

    @property
    def per_channel_fallback(self) -> bool | None:
        """True when the weight is quantized per channel (its width not a multiple of G)."""
        if self.block_size is None:
            return None
        return self.block_size[-1] != self.group_size

    def calculate_qparams(self) -> tuple[np.ndarray, np.ndarray]:
        """The observer's ``(scale, zero_point)`` of the last weight."""
        return self.activation_post_process.calculate_qparams()

    def forward(self, x: Any) -> Any:
        """Observe (recompute the per-group qparams) if enabled, then fake-quantize if enabled.

        Parameters
        ----------
        x : float32 ndarray (N, K)

        Returns
        -------
        y : float32 ndarray (N, K)
            ``fake_quantize_affine(x, block_size, scale, zero_point, quant_min, quant_max)``,
            or ``x`` when fake quantization is disabled; :attr:`ctx` holds the STE mask.

        Raises
        ------
        TypeError
            ``x`` not float32.
        RuntimeError
            Fake quantization with the observer off before any observation.
        """
        if self._forward_pre_hooks:  # register_forward_pre_hook (e.g. the quantizer report)
            x = self._run_forward_pre_hooks(x)
        x = self._x32(x, type(self).__name__)
        if self.observer_enabled:
            obs: Any = self.activation_post_process
            obs(x)
            self.scale, self.zero_point = obs.calculate_qparams()
            self.block_size = obs.block_size
        if not self.fake_quant_enabled:
            return self._done(x, x, None)
        if self.block_size is None:
            raise RuntimeError(f"{type(self).__name__}: no qparams yet (observe a weight first)")
        y, mask = fake_quantize_affine_cachemask(
            x, self.block_size, self.scale, self.zero_point, self.quant_min, self.quant_max
        )
        return self._done(x, y, mask)

    def report_fake_quant(self, x: Any) -> tuple[np.ndarray, int]:
        """:meth:`forward`'s fake quantization with the current qparams (its float32 bits, as
        float64) and the count of values outside the range, its STE mask's zeros
        (:func:`nbqat.train.report.quantizer_report`); ``x`` itself before any observation."""
        if self.block_size is None:
            return np.asarray(x, np.float64), 0
        qp = (self.block_size, self.scale, self.zero_point, self.quant_min, self.quant_max)
        y, mask = fake_quantize_affine_cachemask(np.ascontiguousarray(x, _F32), *qp)
        return np.asarray(y, np.float64), int(mask.size - np.count_nonzero(mask))

    def state_dict(self) -> dict[str, np.ndarray]:
        """Flags, ``scale``, ``zero_point`` and ``block_size``."""
        st = super().state_dict()
        st["block_size"] = np.asarray(self.block_size or (), np.int64)
        return st

    _OPTIONAL = ("block_size",)

    def load_state_dict(self, state: dict[str, Any], strict: bool = True) -> None:
        """Load :meth:`state_dict` output (see :meth:`_LowBitBase.load_state_dict`; a
        ``block_size`` of positive ints, or empty before any forward)."""
        b = np.asarray(state.get("block_size", ()))
        if b.size and (b.ndim != 1 or b.dtype.kind not in "iu" or np.any(b < 1)):
            raise ValueError(f"load_state_dict: block_size must be positive ints, got {b}")
        super().load_state_dict(state, strict)  # checked whole before anything changes
        self.block_size = tuple(int(v) for v in b) or None

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(group_size={self.group_size}, quant_min={self.quant_min}, "
            f"quant_max={self.quant_max}, qscheme={self.qscheme}, block_size={self.block_size})"
        )


class PerTokenFakeQuantize(_LowBitBase):
    """Dynamic per-token asymmetric fake quantization of activations (torchao's 8da4w).

    Parameters
    ----------
    quant_min, quant_max : int, default -128, 127
    eps : float, default ``finfo(float32).eps``

    Attributes
    ----------
    scale, zero_point : ndarray
        The last batch's per-token qparams (float32, int32), shaped ``x.shape[:-1]``.
    dtype, qscheme : str
        ``"qint8"``, ``"per_token_affine"``.
    """

    def __init__(self, quant_min: int = -128, quant_max: int = 127, eps: float = EPS_TOKEN):
        self.quant_min, self.quant_max, self.eps = int(quant_min), int(quant_max), float(eps)
        self.dtype, self.qscheme = "qint8", "per_token_affine"
        self._init_flags()

    def qparams_of(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray, tuple[int, ...]]:
        """Per-token ``(scale, zero_point, block_size)`` of ``x`` (choose_qparams_affine)."""
        block = (1,) * (x.ndim - 1) + (int(x.shape[-1]),)
        s, z = choose_qparams_affine(
            x, "asymmetric", block, self.quant_min, self.quant_max, eps=self.eps
        )
        return np.asarray(s, _F32), np.asarray(z, np.int32), block

    def forward(self, x: Any) -> Any:
        """Fake-quantize every token (row of the last axis) with its own qparams if enabled.

        Parameters
        ----------
        x : float32 ndarray (..., K)

        Returns
        -------
        y : float32 ndarray like ``x`` (``x`` itself when fake quantization is disabled)
        """
        if self._forward_pre_hooks:  # register_forward_pre_hook (e.g. the quantizer report)
            x = self._run_forward_pre_hooks(x)
        x = self._x32(x, type(self).__name__)
        if not self.fake_quant_enabled or x.size == 0:
            return self._done(x, x, None)
        s, z, block = self.qparams_of(x)
        self.scale, self.zero_point = s, z
        y, mask = fake_quantize_affine_cachemask(x, block, s, z, self.quant_min, self.quant_max)
        return self._done(x, y, mask)

    def report_fake_quant(self, x: Any) -> tuple[np.ndarray, int]:
        """This batch's per-token fake quantization (float64 of the float32 result), 0
        saturated (the range spans every token's min and max)."""
        x32 = np.ascontiguousarray(x, _F32)
        if x32.size == 0:
            return x32.astype(np.float64), 0
        s, z, block = self.qparams_of(x32)
        y = fake_quantize_affine_cachemask(x32, block, s, z, self.quant_min, self.quant_max)[0]
        return np.asarray(y, np.float64), 0

    def __repr__(self) -> str:
        return f"{type(self).__name__}(quant_min={self.quant_min}, quant_max={self.quant_max})"


class Float8FakeQuantize(_LowBitBase):
    """Dynamic float8 fake quantization (a scale per row, or per tensor).

    Parameters
    ----------
    dtype : {"float8_e4m3fn", "float8_e5m2"}, default "float8_e4m3fn"
    granularity : {"per_row", "per_tensor"}, default "per_row"
        ``per_row``: one scale per output channel of a (N, K) weight (``block (1, K)``);
        ``per_tensor``: one scale (activations).
    hp_value_lb, hp_value_ub : float, optional
        Bounds on ``max |x|`` before the scale's division (torchao's
        ``Float8FakeQuantizeConfig`` fields; default none, as there). Without a lower bound
        an all-zero block gets scale 0 and NaN outputs, as in torchao;
        :func:`~nbqat.quantization.qconfig.float8_qconfig` sets
        :data:`~nbqat.quantization.qconfig.FLOAT8_AMAX_LB`.

    Attributes
    ----------
    scale : float32 ndarray
        ``choose_scale_float8``'s (dimensions kept): (N, 1) per row, (1, ..., 1) per tensor.
    quant_min, quant_max : float
        ``-max``, ``max`` of the format (448 / 57344).
    """

    _MAX = {"float8_e4m3fn": 448.0, "float8_e5m2": 57344.0}

    def __init__(
        self,
        dtype: str = "float8_e4m3fn",
        granularity: str = "per_row",
        hp_value_lb: float | None = None,
        hp_value_ub: float | None = None,
    ) -> None:
        for name, v in (("hp_value_lb", hp_value_lb), ("hp_value_ub", hp_value_ub)):
            if v is not None and not (isinstance(v, int | float) and math.isfinite(v) and v >= 0):
                raise ValueError(f"{name} must be None or a finite float >= 0, got {v!r}")
        self.hp_value_lb, self.hp_value_ub = hp_value_lb, hp_value_ub
        if dtype not in self._MAX:
            raise ValueError(f"dtype must be one of {sorted(self._MAX)}, got {dtype!r}")
        if granularity not in ("per_row", "per_tensor"):
            raise ValueError(f"granularity must be 'per_row' or 'per_tensor', got {granularity!r}")
        self.dtype, self.granularity = dtype, granularity
        self.qscheme = f"{granularity}_float8"
        mx: Any = self._MAX[dtype]
        self.quant_min, self.quant_max = -mx, mx
        self._init_flags()
        self.zero_point = np.zeros(1, np.int32)

    def forward(self, x: Any) -> Any:
        """Recompute the scale (observer on), then fake-quantize to float8 (if enabled).

        Parameters
        ----------
        x : float32 ndarray

        Returns
        -------
        y : float32 ndarray like ``x``
        """
        if self._forward_pre_hooks:  # register_forward_pre_hook (e.g. the quantizer report)
            x = self._run_forward_pre_hooks(x)
        x = self._x32(x, type(self).__name__)
        per_row = self.granularity == "per_row" and x.ndim >= 2
        xs = x  # data-parallel ranks (sync_observers): the global batch's per-tensor scale
        if self.observer_enabled and not per_row:
            xs = global_sample(x, self.process_group, type(self).__name__)
        if self.observer_enabled and xs.size:
            block = (1,) * (x.ndim - 1) + (x.shape[-1],) if per_row else xs.shape
            bounds = {"hp_value_lb": self.hp_value_lb, "hp_value_ub": self.hp_value_ub}
            self.scale = np.asarray(choose_scale_float8(xs, block, self.dtype, **bounds), _F32)
            self.zero_point = np.zeros(self.scale.shape, np.int32)
        if not self.fake_quant_enabled or x.size == 0:
            return self._done(x, x, None)
        scale = self.scale
        if scale.ndim != x.ndim:  # a per-tensor scale from another rank of input
            scale = scale.reshape((1,) * x.ndim) if scale.size == 1 else scale
        y, mask = fake_quantize_float8_cachemask(x, scale, self.dtype)
        return self._done(x, y, mask)

    def _set_state(self, scale: np.ndarray, zero_point: np.ndarray) -> None:
        self.scale, self.zero_point = scale, np.zeros(scale.shape, np.int32)

    def report_fake_quant(self, x: Any) -> tuple[np.ndarray, int]:
        """Float8 fake quantization with the current scale (float64) and the count past
        ``+-max``."""
        x32 = np.ascontiguousarray(x, _F32)
        if x32.size == 0 or self.scale.size == 1 and self.scale.ndim != x32.ndim:
            s = np.asarray(self.scale, _F32).reshape((1,) * x32.ndim)
        else:
            s = self.scale
        y, mask = fake_quantize_float8_cachemask(x32, s, self.dtype)
        return np.asarray(y, np.float64), int(np.count_nonzero(~np.asarray(mask)))

    def __repr__(self) -> str:
        kw = {"hp_value_lb": self.hp_value_lb, "hp_value_ub": self.hp_value_ub}
        bounds = "".join(f", {k}={v!r}" for k, v in kw.items() if v is not None)
        return f"{type(self).__name__}(dtype={self.dtype}, granularity={self.granularity}{bounds})"
