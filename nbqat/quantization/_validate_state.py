"""Checks of the quantizer modules' arguments: observer factories, quantization ranges given to
a module, and state dicts; part of :mod:`nbqat._validate` (its rules: TypeError for a wrong type
or dtype, ValueError for a wrong value, messages that name the argument and the fix)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np

from nbqat._validate import check_int
from nbqat.quantization._validate_qparams import _float32_scale_ok

__all__ = [
    "check_built",
    "check_channel_len",
    "check_factory",
    "check_flag",
    "check_lowbit_state",
    "check_module_range",
    "check_state_keys",
    "check_state_qparams",
]


def check_factory(factory: Any, instance_of: type, who: str) -> None:
    """Raise TypeError unless ``factory`` is a callable that is not itself an ``instance_of``
    (an observer class or ``with_args`` factory, not an observer)."""
    if isinstance(factory, instance_of):
        raise TypeError(
            f"{who}: observer must be an observer class or factory (e.g. "
            "MovingAverageMinMaxObserver or MinMaxObserver.with_args(...)), not an instance"
        )
    if not callable(factory):
        raise TypeError(f"{who}: observer must be callable (a class or factory), got {factory!r}")


def check_built(obj: Any, instance_of: type, who: str) -> None:
    """Raise TypeError unless the factory's product ``obj`` is an ``instance_of``."""
    if not isinstance(obj, instance_of):
        raise TypeError(f"{who}: observer() must build an nbqat observer, got {type(obj).__name__}")


def check_module_range(quant_min: Any, quant_max: Any, who: str, *, strict: bool) -> None:
    """A module's ``quant_min``/``quant_max``: both or neither (None), ``quant_min < quant_max``
    (``strict``) or ``<=``.

    Raises
    ------
    TypeError
        A bound that is not an integer.
    ValueError
        Only one bound given, or the bounds out of order.
    """
    if quant_min is None and quant_max is None:
        return
    if quant_min is None or quant_max is None:
        raise ValueError(f"{who}: give both quant_min and quant_max, or neither")
    lo, hi = check_int(quant_min, "quant_min"), check_int(quant_max, "quant_max")
    if lo > hi or (strict and lo == hi):
        op = "<" if strict else "<="
        raise ValueError(f"{who}: quant_min ({lo}) must be {op} quant_max ({hi})")


def check_channel_len(channel_len: Any, who: str) -> int:
    """``channel_len`` of a learnable quantizer: -1 (per tensor) or a positive int."""
    n = check_int(channel_len, "channel_len")
    if not (n == -1 or n > 0):
        raise ValueError(f"{who}: channel_len must be -1 or a positive int, got {channel_len!r}")
    return n


def check_flag(state: dict[str, Any], key: str) -> bool:
    """A state dict's 0/1 flag ``state[key]`` as a bool (ValueError otherwise)."""
    v = np.asarray(state[key]).reshape(-1)
    if v.size != 1 or v[0] not in (0, 1):
        raise ValueError(f"load_state_dict: {key} must be one 0/1 value, got {v}")
    return bool(v[0])


def check_state_keys(
    state: dict[str, Any], need: Iterable[str], optional: Iterable[str], prefix: str, strict: bool
) -> None:
    """Every key of ``need`` present (KeyError); with ``strict``, no key outside ``need``,
    ``optional`` and the sub-state under ``prefix`` (ValueError)."""
    need = list(need)
    missing = [k for k in need if k not in state]
    if missing:
        raise KeyError(f"load_state_dict: missing key(s) {missing}")
    known = set(need) | set(optional)
    extra = sorted(k for k in state if k not in known and not k.startswith(prefix))
    if strict and extra:
        raise ValueError(f"load_state_dict: unexpected key(s) {extra} (pass strict=False)")


def check_state_qparams(
    scale: Any, zero_point: Any, *, qrange: tuple[int, int] | None, per_tensor: bool
) -> tuple[np.ndarray, np.ndarray]:
    """A state dict's ``scale`` and ``zero_point``: non-empty, equal shapes, scales finite and
    > 0; with ``qrange`` an integer zero point inside it and scales the fake-quantize functions
    accept (>= 2.9e-39), else (learnable: its forward clamps the scale to ``eps``) finite float
    zero points.

    Returns
    -------
    (numpy.ndarray, numpy.ndarray)
        float32 (n,) scale; int32 (n,) zero point (``qrange`` given) or float32 (n,).

    Raises
    ------
    TypeError
        A float zero point where an integer one is expected.
    ValueError
        Empty or unequal shapes, more than one element ``per_tensor``, bad values.
    """
    s = np.array(scale, dtype=np.float32).reshape(-1)
    z_raw = np.asarray(zero_point)
    if qrange is not None and z_raw.dtype.kind not in "iu":
        raise TypeError(
            f"load_state_dict: zero_point must be an integer array, got dtype {z_raw.dtype}"
        )
    if qrange is not None:  # the range check in the state's own dtype: an int64 2**32 + 3
        z_raw = z_raw.reshape(-1)  # or a uint64 2**64 - 1 must not wrap into range in a cast
        if np.any((z_raw < qrange[0]) | (z_raw > qrange[1])):
            raise ValueError(f"load_state_dict: zero_point outside [{qrange[0]}, {qrange[1]}]")
    with np.errstate(over="ignore"):  # a float zero point past float32 is refused below
        z = z_raw.astype(np.int32 if qrange is not None else np.float32).reshape(-1)
    if s.size == 0 or s.shape != z.shape:
        raise ValueError(
            f"load_state_dict: scale {s.shape} and zero_point {z.shape} must be non-empty "
            "with equal shapes"
        )
    if per_tensor and s.size != 1:
        raise ValueError(f"load_state_dict: per-tensor scale must have 1 element, got {s.size}")
    if not np.all(np.isfinite(s) & (s > 0)):
        raise ValueError("load_state_dict: scale must be finite and > 0")
    if qrange is not None and not np.all(_float32_scale_ok(s)):  # what every forward refuses
        raise ValueError(
            "load_state_dict: scale must be >= 2.9e-39 (its float32 reciprocal overflows "
            f"below), got {float(s.min())!r}"
        )
    if qrange is None:
        if not np.all(np.isfinite(z)):
            raise ValueError("load_state_dict: zero_point must be finite")
    return s, z


def check_lowbit_state(
    state: Any, strict: bool, who: str, optional: tuple[str, ...] = ()
) -> tuple[dict[str, bool], np.ndarray, np.ndarray]:
    """A low-bit quantizer's state dict (``fake_quant_enabled``, ``observer_enabled``,
    ``scale``, ``zero_point``; a ``block_size`` is the caller's), checked before anything is
    loaded; ``optional`` names the caller's further keys (accepted under ``strict``).

    The scale is any float32 array its forward can produce (torchao checks none: 0 for an
    all-zero block, NaN / Inf for non-finite data); the zero point an integer array of the
    scale's size, representable in int32 (checked in its own dtype: no wrap in the cast).

    Returns
    -------
    (dict, numpy.ndarray, numpy.ndarray)
        The flags by attribute name, the float32 scale and the int32 zero point.

    Raises
    ------
    KeyError
        A missing key.
    ValueError
        An unexpected key (``strict``), a flag not 0/1, a zero point of another size, not
        integral or past int32.
    """
    need = ("fake_quant_enabled", "observer_enabled", "scale", "zero_point")
    missing = [k for k in need if k not in state]
    if missing:
        raise KeyError(f"{who}.load_state_dict: missing keys {missing}")
    extra = sorted(set(state) - {*need, *optional})
    if strict and extra:
        raise ValueError(f"{who}.load_state_dict: unexpected keys {extra}")
    flags = {k: check_flag(state, k) for k in need[:2]}
    try:
        s = np.array(state["scale"], dtype=np.float32)
    except (TypeError, ValueError):
        raise ValueError(f"{who}.load_state_dict: scale must be a float array") from None
    z = np.asarray(state["zero_point"])
    i32 = np.iinfo(np.int32)
    if z.dtype.kind not in "iu" or z.size != s.size or np.any((z < i32.min) | (z > i32.max)):
        raise ValueError(
            f"{who}.load_state_dict: zero_point must be an integer array of the scale's size "
            f"({s.size}) within int32, got {z.dtype} of size {z.size}"
        )
    return flags, s, z.astype(np.int32).reshape(s.shape)
