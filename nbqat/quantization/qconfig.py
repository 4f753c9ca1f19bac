"""QConfig (which fake-quantize modules to build) and QATConfig (the training loop's settings).

``default_qat_qconfig`` follows torch's default QAT qconfig with one deliberate difference:

* activations: :class:`~nbqat.FakeQuantize` with a :class:`~nbqat.MovingAverageMinMaxObserver`,
  quint8, per-tensor affine, ``[0, 255]``. torch's x86 default sets ``reduce_range=True``
  (``[0, 127]``) to avoid an overflow in the x86 ``vpmaddubsw`` int8 kernels; nbqat's int8
  reference path accumulates in int32 and has no such overflow, so it keeps the full range
  (``reduce_range=False``: one more bit of activation precision).
* weights: :class:`~nbqat.FakeQuantize` with a
  :class:`~nbqat.MovingAveragePerChannelMinMaxObserver`, qint8, per-channel symmetric,
  ``ch_axis=0`` (output features), ``[-128, 127]``
  (torch's ``default_per_channel_weight_fake_quant``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from nbqat.quantization.fake_quantize import FakeQuantize, LearnableFakeQuantize
from nbqat.quantization.observers import (
    MovingAverageMinMaxObserver,
    MovingAveragePerChannelMinMaxObserver,
    _MinMaxBase,
)

__all__ = [
    "FLOAT8_AMAX_LB",
    "QATConfig",
    "QConfig",
    "WEIGHT_BITS",
    "WEIGHT_DTYPES",
    "WEIGHT_GROUP_SIZE",
    "default_qat_qconfig",
    "float8_qconfig",
    "int4_weight_qconfig",
    "weight_format_qconfig",
]


def _check_factory(value: Any, name: str) -> None:
    if isinstance(value, (FakeQuantize, LearnableFakeQuantize, _MinMaxBase)):
        raise TypeError(
            f"QConfig.{name} must be a factory (a class or FakeQuantize.with_args(...)), not an "
            f"instance of {type(value).__name__}: every layer needs its own module"
        )
    if not callable(value):
        raise TypeError(f"QConfig.{name} must be callable (a factory), got {value!r}")


@dataclasses.dataclass(frozen=True)
class QConfig:
    """Factories of the fake-quantize modules for activations and weights (torch's ``QConfig``).

    Parameters
    ----------
    activation : callable or None
        No-argument factory returning a new FakeQuantize (or LearnableFakeQuantize) for
        activations, e.g. ``FakeQuantize.with_args(observer=MovingAverageMinMaxObserver)``;
        None keeps activations in float (weight-only quantization, e.g.
        ``int4_weight_qconfig(32, activation=None)``).
    weight : callable
        The same for weights.
    weight_fallback : callable or None, default None
        Factory of the weight quantizer of a layer that a grouped ``weight`` factory
        (:class:`~nbqat.quantization.lowbit_quantize.GroupFakeQuantize`) cannot split into
        groups: its input width ``K`` smaller than the group size or not a multiple of it (e.g.
        ``default_qat_qconfig.weight``: such layers stay 8-bit per channel). None: the grouped
        quantizer quantizes those weights per output channel at its own bits (int4). Not
        read for other weight factories. Not part of iteration (``activation, weight`` as
        torch's namedtuple).

    Raises
    ------
    TypeError
        A module instance instead of a factory, or something not callable.
    """

    activation: Callable[[], Any] | None
    weight: Callable[[], Any]
    weight_fallback: Callable[[], Any] | None = None

    def __post_init__(self) -> None:
        if self.activation is not None:
            _check_factory(self.activation, "activation")
        _check_factory(self.weight, "weight")
        if self.weight_fallback is not None:
            _check_factory(self.weight_fallback, "weight_fallback")

    def __iter__(self) -> Iterator[Callable[[], Any] | None]:  # torch's QConfig: a namedtuple
        return iter((self.activation, self.weight))

    def weight_quantizer(self, fq: Any, weight: Any) -> Any:
        """``fq`` (built by :attr:`weight`) for ``weight``, or a :attr:`weight_fallback`
        quantizer where ``fq`` is grouped and ``weight``'s input width cannot be split into
        its groups.

        Parameters
        ----------
        fq : quantizer
            ``self.weight()``.
        weight : ndarray (N, K) or None
            The weight ``fq`` will quantize (None: unknown, ``fq`` is kept).

        Returns
        -------
        quantizer
        """
        from nbqat.quantization.lowbit_quantize import GroupFakeQuantize, group_block

        if self.weight_fallback is None or not isinstance(fq, GroupFakeQuantize):
            return fq
        shape = tuple(np.shape(weight)) if weight is not None else ()
        if len(shape) < 2 or group_block(shape, fq.group_size)[1]:
            return fq
        return self.weight_fallback()


default_qat_qconfig = QConfig(
    activation=FakeQuantize.with_args(
        observer=MovingAverageMinMaxObserver,
        quant_min=0,
        quant_max=255,
        dtype="quint8",
        qscheme="per_tensor_affine",
        reduce_range=False,
    ),
    weight=FakeQuantize.with_args(
        observer=MovingAveragePerChannelMinMaxObserver,
        quant_min=-128,
        quant_max=127,
        dtype="qint8",
        qscheme="per_channel_symmetric",
        ch_axis=0,
    ),
)


_ACTIVATIONS = ("per_tensor", "per_token", None)


def int4_weight_qconfig(
    group_size: int, activation: str | None = "per_tensor", *, int8_fallback: bool = False
) -> QConfig:
    """Grouped symmetric int4 weights with 8-bit (or float) activations.

    Parameters
    ----------
    group_size : int
        Input features per weight scale (``G``, positive). A layer whose input width is
        smaller than ``G`` or not a multiple of it is quantized per output channel instead
        (:attr:`~nbqat.quantization.lowbit_quantize.GroupFakeQuantize.per_channel_fallback`).
    activation : {"per_tensor", "per_token", None}, default "per_tensor"
        ``"per_tensor"``: the default static quint8 activations (``default_qat_qconfig``'s);
        ``"per_token"``: dynamic per-token asymmetric int8 (torchao's
        ``Int8DynActInt4WeightQATQuantizer``); None: float activations (weight-only int4,
        torchao's ``Int4WeightOnlyQATQuantizer`` arithmetic on the weights).
    int8_fallback : bool, default False
        True: a layer whose input width is smaller than ``G`` or not a multiple of it keeps
        ``default_qat_qconfig``'s 8-bit per-channel weights (:attr:`QConfig.weight_fallback`;
        ``nbqat train --weight-bits 4``'s rule); False: int4 per channel.

    Returns
    -------
    QConfig
        Weights: :class:`~nbqat.quantization.lowbit_quantize.GroupFakeQuantize` (``[-8, 7]``, scale
        ``max |w| / 7.5`` per group, :func:`~nbqat.choose_qparams_affine`).

    Raises
    ------
    TypeError, ValueError
        ``group_size`` not a positive int; an unknown ``activation``; ``int8_fallback`` not a
        bool.
    """
    from nbqat.quantization.lowbit_quantize import (
        GroupFakeQuantize,
        PerTokenFakeQuantize,
        check_group_size,
    )

    g = check_group_size(group_size)
    if activation not in _ACTIVATIONS:
        raise ValueError(f"activation must be one of {_ACTIVATIONS}, got {activation!r}")
    act: Any = {
        "per_tensor": default_qat_qconfig.activation,
        "per_token": PerTokenFakeQuantize.with_args(),
        None: None,
    }[activation]
    if not isinstance(int8_fallback, bool):
        raise TypeError(f"int8_fallback must be a bool, got {int8_fallback!r}")
    fallback = default_qat_qconfig.weight if int8_fallback else None
    return QConfig(
        activation=act, weight=GroupFakeQuantize.with_args(group_size=g), weight_fallback=fallback
    )


#: The lower bound on a float8 block's ``max |x|`` that :func:`float8_qconfig` sets (the
#: quantizers' ``hp_value_lb``): torchao's float8 training clamps its amax at the same 1e-12
#: (``float8/float8_utils.py``, ``EPS``), so an all-zero block (an LSTM's zero initial state,
#: a pruned weight row) quantizes to zeros, not to NaN (scale 0, then 0 / 0).
FLOAT8_AMAX_LB = 1e-12


def float8_qconfig(dtype: str = "float8_e4m3fn", activations: bool = True) -> QConfig:
    """Float8 weights (a dynamic scale per output channel) and activations (per tensor).

    Parameters
    ----------
    dtype : {"float8_e4m3fn", "float8_e5m2"}, default "float8_e4m3fn"
    activations : bool, default True
        False keeps activations in float (weight-only float8).

    Returns
    -------
    QConfig
        :class:`~nbqat.quantization.lowbit_quantize.Float8FakeQuantize` factories with
        ``hp_value_lb = FLOAT8_AMAX_LB`` (1e-12, torchao's float8 training clamp): an all-zero
        block (an LSTM's zero initial state) gives zeros, where torchao's default config
        (no bound) gives NaN; any block with ``max |x| >= 1e-12`` is torchao's bits.
    """
    from nbqat.quantization.lowbit_quantize import Float8FakeQuantize

    f8 = Float8FakeQuantize.with_args(dtype=dtype, hp_value_lb=FLOAT8_AMAX_LB)
    w = f8.with_args(granularity="per_row")
    Float8FakeQuantize(dtype)  # validates dtype now, not at prepare_qat
    a = f8.with_args(granularity="per_tensor") if activations else None
    return QConfig(activation=a, weight=w)


#: The weight formats of :func:`weight_format_qconfig` (``nbqat train --weight-bits`` /
#: ``--weight-dtype``): 8 (per-channel int8) or 4 (grouped int4); integer or float8 weights.
WEIGHT_BITS = (8, 4)
WEIGHT_DTYPES = ("int", "float8_e4m3fn")
#: Input features per int4 weight scale when ``--group-size`` is not given.
WEIGHT_GROUP_SIZE = 32


def weight_format_qconfig(qconfig: QConfig, cfg: Any) -> QConfig:
    """``qconfig`` with the weights of ``nbqat train``'s ``--weight-bits`` / ``--group-size`` /
    ``--weight-dtype`` (``cfg``: a TrainConfig); the activations are kept. With
    ``--weight-bits 4`` a layer whose input width is smaller than the group size or not a
    multiple of it keeps ``qconfig``'s (8-bit per-channel) weights
    (:attr:`QConfig.weight_fallback`): on the main job, the ridge-started linear skip (366
    inputs) alone at int4 per channel made the PTQ model 45 % worse on the test P50, at 8
    bits 2 %."""
    from nbqat.quantization.lowbit_quantize import GroupFakeQuantize

    fmt = cfg.weight_format()
    if fmt["weight_dtype"] != "int":
        w = float8_qconfig(fmt["weight_dtype"], activations=False).weight
    elif fmt["weight_bits"] == 4:
        w = GroupFakeQuantize.with_args(group_size=fmt["group_size"])
        return QConfig(activation=qconfig.activation, weight=w, weight_fallback=qconfig.weight)
    else:
        return qconfig
    return QConfig(activation=qconfig.activation, weight=w)


@dataclasses.dataclass
class QATConfig:
    """Settings of the QAT training loop.

    Attributes
    ----------
    calibration_batches : int, default 100
        Batches observed (observers on, fake quant off) before QAT starts (the Rust original's
        ``QATConfig::calibration_batches``).
    qconfig : QConfig, default default_qat_qconfig
        Fake-quantize factories for activations and weights.
    max_norm : float or None, default 1.0
        Gradient-clipping norm (``clip_grad_norm_``); None disables clipping. ``nbqat train``'s
        QAT phase clips at its QAT model's ``config.max_norm`` (``--max-norm``); a loop of
        your own passes it per step: ``qat.train_step(batch, opt, qat.config.max_norm)``.
    learnable_scales : bool, default False
        Use LearnableFakeQuantize (LSQ) instead of FakeQuantize.
    freeze_observers_after_calibration : bool, default False
        Disable the observers once calibration ends (fixed qparams during QAT).
    quantize_attention : bool, default True
        Fake-quantize the attention projections (and probabilities); False keeps every
        InterpretableMultiHeadAttention in float (read by :func:`~nbqat.nn.prepare_qat`).
    quantize_output_head : bool, default False
        Fake-quantize the quantile output head: the module a model names in its
        ``output_head`` attribute (the forecasters'; read by :func:`~nbqat.nn.prepare_qat`).
    quantize_linear_skip : bool, default False
        Fake-quantize the TFT's linear skip (``TFTConfig.linear_skip``), which writes into the
        output beside the head (read by :func:`~nbqat.nn.prepare_qat`).
        Quantized, its rows of small ridge weights on one int8 grid per row and its
        whole-window input grid were nearly all of the main job's int8 loss: QAT int8 +0.4 %
        and PTQ int8 +2.3 % against the equally fine-tuned float on the shipped data (seed 0),
        +6 % and +41 % on a held-out half-hourly set; in float +0.0 % and +0.0 %, +0.1 % and
        +0.1 %. A checkpoint written before this field existed (its skip quantized) loads with
        True.

    Raises
    ------
    TypeError, ValueError
        A field of the wrong type or out of range.
    """

    calibration_batches: int = 100
    qconfig: QConfig = default_qat_qconfig
    max_norm: float | None = 1.0
    learnable_scales: bool = False
    freeze_observers_after_calibration: bool = False
    quantize_attention: bool = True
    quantize_output_head: bool = False
    quantize_linear_skip: bool = False

    def __post_init__(self) -> None:
        cb = self.calibration_batches
        if isinstance(cb, bool) or not isinstance(cb, int):
            raise TypeError(f"calibration_batches must be an int, got {cb!r}")
        if cb < 0:
            raise ValueError(f"calibration_batches must be >= 0, got {cb}")
        if not isinstance(self.qconfig, QConfig):
            raise TypeError(f"qconfig must be a QConfig, got {type(self.qconfig).__name__}")
        mn = self.max_norm
        if mn is not None:
            if isinstance(mn, bool) or not isinstance(mn, (int, float)):
                raise TypeError(f"max_norm must be a float or None, got {mn!r}")
            if not mn > 0 or mn != mn or mn == float("inf"):
                raise ValueError(f"max_norm must be a positive finite float or None, got {mn}")
        for f in (
            "learnable_scales",
            "freeze_observers_after_calibration",
            "quantize_attention",
            "quantize_output_head",
            "quantize_linear_skip",
        ):
            if not isinstance(getattr(self, f), bool):
                raise TypeError(f"{f} must be a bool, got {getattr(self, f)!r}")
