"""What every observer is configured with: quantized dtypes and qschemes, torch's range rule,
the constructor's common arguments (written once) and torch's ``with_args`` factory.

Every observer's constructor is ``(own arguments..., dtype, qscheme, reduce_range, quant_min,
quant_max, eps, nonfinite)`` in torch's order: the class names its own leading arguments
(:attr:`nbqat.quantization.observers._MinMaxBase.OWN_PARAMS`) and :func:`constructor_signature`
appends the
common ones, so ``inspect.signature(MinMaxObserver)`` and argument binding (positional or
keyword) are those of torch's classes without seven parameters written out in every class.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any

import numpy as np

#: float32 machine epsilon, torch's default ``eps`` (``torch.finfo(torch.float32).eps``).
EPS = float(np.finfo(np.float32).eps)

#: name -> (lowest, highest, signed) of the full integer range of each quantized dtype.
DTYPES: dict[str, tuple[int, int, bool]] = {
    "qint8": (-128, 127, True),
    "quint8": (0, 255, False),
    "qint4": (-8, 7, True),
    "quint4": (0, 15, False),
    "qint16": (-(2**15), 2**15 - 1, True),
    "qint32": (-(2**31), 2**31 - 1, True),
}
QSCHEMES = (
    "per_tensor_affine",
    "per_tensor_symmetric",
    "per_channel_affine",
    "per_channel_symmetric",
)
NONFINITE = ("raise", "ignore", "propagate")

#: The constructor arguments every observer takes after its own: (name, annotation, default);
#: ``qscheme``'s default (None here) is the class's ``DEFAULT_QSCHEME``.
COMMON_PARAMS: tuple[tuple[str, Any, Any], ...] = (
    ("dtype", str, "quint8"),
    ("qscheme", str, None),
    ("reduce_range", bool, False),
    ("quant_min", int | None, None),
    ("quant_max", int | None, None),
    ("eps", float, EPS),
    ("nonfinite", str, "raise"),
)


@functools.cache
def constructor_signature(own: tuple[tuple[str, Any, Any], ...], qscheme: str) -> inspect.Signature:
    """The public constructor signature: ``own`` (name, annotation, default) then the common
    arguments, every one positional-or-keyword (torch's)."""
    kind = inspect.Parameter.POSITIONAL_OR_KEYWORD
    params = [
        inspect.Parameter(name, kind, default=qscheme if name == "qscheme" else d, annotation=a)
        for name, a, d in own + COMMON_PARAMS
    ]
    return inspect.Signature(params, return_annotation=None)


class ConstructorSignature:
    """Class attribute ``__signature__`` of the observers: on the class (what
    ``inspect.signature(cls)`` reads) the constructor's signature from the class's
    ``OWN_PARAMS`` and ``DEFAULT_QSCHEME``; absent on instances (``inspect.signature(obs)``
    then describes ``obs(x)``)."""

    def __get__(self, obj: Any, cls: Any) -> inspect.Signature:
        if obj is not None:
            raise AttributeError("__signature__")
        return constructor_signature(cls.OWN_PARAMS, cls.DEFAULT_QSCHEME)


def bind_arguments(cls: type, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
    """Every constructor argument of ``cls`` by name (defaults filled in).

    Raises
    ------
    TypeError
        Too many positional arguments, an unknown or a repeated keyword (the message shows the
        signature).
    """
    sig: inspect.Signature = cls.__signature__  # type: ignore[attr-defined]
    try:
        bound = sig.bind(*args, **kwargs)
    except TypeError as err:
        raise TypeError(f"{cls.__name__}: {err}; the signature is {cls.__name__}{sig}") from None
    bound.apply_defaults()
    return dict(bound.arguments)


class PartialWrapper:
    """A factory holding keyword arguments (torch's ``_PartialWrapper``): call it for a new
    object; ``with_args`` adds or overrides arguments."""

    def __init__(self, p: functools.partial) -> None:
        self.p = p

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.p(*args, **kwargs)

    def with_args(self, **kwargs: Any) -> PartialWrapper:
        return PartialWrapper(functools.partial(self.p, **kwargs))

    def __repr__(self) -> str:
        return f"{self.p.func.__name__}.with_args({self.p.keywords})"


def with_args(cls_or_factory: Any, **kwargs: Any) -> PartialWrapper:
    """A :class:`PartialWrapper` of ``cls_or_factory`` with these keyword arguments."""
    return PartialWrapper(functools.partial(cls_or_factory, **kwargs))


def norm_name(value: Any, what: str, allowed: tuple[str, ...]) -> str:
    """Normalize ``"torch.qint8"`` / ``"qint8"`` style names (``str(torch.qint8)`` works too)."""
    if not isinstance(value, str):
        value = str(value)
    name = value.removeprefix("torch.")
    if name not in allowed:
        raise ValueError(f"unknown {what} {value!r}: use one of {', '.join(allowed)}")
    return name


def resolve_range(
    dtype: str, reduce_range: bool, quant_min: Any, quant_max: Any
) -> tuple[int, int, bool]:
    """``(quant_min, quant_max, has_customized_qrange)`` as torch's ``calculate_qmin_qmax``.

    Default ranges: qint8 [-128, 127] (reduce_range [-64, 63]), quint8 [0, 255] ([0, 127]),
    qint4 [-8, 7] ([-4, 3]), quint4 [0, 15] ([0, 7]), qint16 and qint32 their full ranges
    (reduce_range ignored, as torch). A custom range must contain 0 and lie inside the dtype's
    range; reduce_range halves it (floor division, torch's rule).
    """
    lo, hi, _ = DTYPES[dtype]
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


def int_in_range(value: Any, name: str, lo: int, hi: int | None = None) -> int:
    """``int(value)`` for an int in ``[lo, hi]`` (TypeError for a non-int or a bool,
    ValueError outside the range)."""
    what = f"an int >= {lo}" if hi is None else f"an int in [{lo}, {hi}]"
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be {what}, got {value!r}")
    if value < lo or (hi is not None and value > hi):
        raise ValueError(f"{name} must be {what}, got {value}")
    return int(value)


def check_common(
    who: str,
    per_channel: bool,
    dtype: Any,
    qscheme: Any,
    reduce_range: Any,
    quant_min: Any,
    quant_max: Any,
    eps: Any,
    nonfinite: Any,
) -> dict[str, Any]:
    """The observer attributes of the common constructor arguments (:data:`COMMON_PARAMS`),
    checked: ``dtype``, ``qscheme``, ``reduce_range``, ``symmetric``, ``quant_min``,
    ``quant_max``, ``has_customized_qrange``, ``eps`` (float32) and ``nonfinite``.

    Raises
    ------
    TypeError
        ``reduce_range`` not a bool, ``eps`` not a number, a custom range not of ints.
    ValueError
        Unknown names, a qscheme of the other kind (per tensor / per channel) than ``who``,
        symmetric quint8 with ``reduce_range``, a bad custom range or ``eps``.
    """
    out: dict[str, Any] = {
        "dtype": norm_name(dtype, "dtype", tuple(DTYPES)),
        "qscheme": norm_name(qscheme, "qscheme", QSCHEMES),
    }
    if out["qscheme"].startswith("per_channel") != per_channel:
        kind = "per_channel" if per_channel else "per_tensor"
        other = "MinMaxObserver for per-tensor" if per_channel else "PerChannelMinMaxObserver"
        raise ValueError(
            f"{who} takes a {kind}_affine or {kind}_symmetric qscheme, got {qscheme!r}; "
            f"use {other if per_channel else other + ' for per-channel'} qparams"
        )
    if not isinstance(reduce_range, (bool, np.bool_)):
        raise TypeError(f"reduce_range must be a bool, got {reduce_range!r}")
    out["reduce_range"] = bool(reduce_range)
    out["symmetric"] = out["qscheme"].endswith("symmetric")
    if out["symmetric"] and out["reduce_range"] and out["dtype"] == "quint8":
        raise ValueError(
            "reduce_range=True is not supported with symmetric quint8 quantization "
            "(torch raises too): use qint8, or reduce_range=False"
        )
    qrange = resolve_range(out["dtype"], out["reduce_range"], quant_min, quant_max)
    out["quant_min"], out["quant_max"], out["has_customized_qrange"] = qrange
    try:
        with np.errstate(over="ignore"):  # past float32: Inf, refused below
            eps32 = np.float32(eps)
    except (TypeError, ValueError):
        raise TypeError(f"eps must be a positive float, got {eps!r}") from None
    if not (np.isfinite(eps32) and eps32 > 0):
        raise ValueError(f"eps must be a positive finite float, got {eps!r}")
    out["eps"] = eps32
    out["nonfinite"] = norm_name(nonfinite, "nonfinite policy", NONFINITE)
    return out
