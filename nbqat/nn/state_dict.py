"""The checks of a ``state_dict`` against a model's parameters (torch's ``load_state_dict``
rules), shared by :meth:`nbqat.nn.Module.load_state_dict` and the QAT models'
(:mod:`nbqat.nn.qat_state_dict`): every key and value is checked before the first write."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np

from nbqat.npz_state import CheckpointError

__all__ = [
    "IncompatibleKeys",
    "bound_params",
    "checked_param",
    "load_params",
    "match_keys",
    "plain_values",
]


class IncompatibleKeys(NamedTuple):
    """What ``load_state_dict`` did not load (torch's ``_IncompatibleKeys``).

    Attributes
    ----------
    missing_keys : list of str
        The model's keys that the state_dict lacks (left as they were).
    unexpected_keys : list of str
        The state_dict's keys that the model does not have (ignored).
    """

    missing_keys: list[str]
    unexpected_keys: list[str]


def bound_params(named: Iterable[tuple[str, Any]], who: str) -> dict[str, np.ndarray]:
    """``dict(named)`` of a model's ``named_parameters()``; a RuntimeError naming the
    parameters that no :class:`~nbqat.nn.ParameterBuffer` has bound yet (their views are None:
    torch's modules own their parameters from construction, nbqat's from the buffer)."""
    params = dict(named)
    unbound = [k for k, v in params.items() if v is None]
    if unbound:
        raise RuntimeError(
            f"{who}: parameter(s) {unbound[:4]} are not bound to a buffer yet: build "
            "nbqat.nn.ParameterBuffer(model) first"
        )
    return params


def match_keys(keys: Sequence[str], state_dict: Any, strict: bool) -> IncompatibleKeys:
    """The :class:`IncompatibleKeys` of ``state_dict`` against a model's ``keys``: a TypeError
    for a ``state_dict`` that is no mapping, a :class:`~nbqat.npz_state.CheckpointError` for
    any missing or unexpected key under ``strict``."""
    if not isinstance(state_dict, Mapping):
        raise TypeError(f"state_dict must be a mapping, got {type(state_dict).__name__}")
    known = set(keys)
    missing = [k for k in keys if k not in state_dict]
    unexpected = [k for k in state_dict if k not in known]
    if strict and (missing or unexpected):
        raise CheckpointError(
            f"load_state_dict: missing key(s) {missing[:8]}, unexpected key(s) "
            f"{unexpected[:8]} (another network or QATConfig? strict=False loads the keys that "
            "match)"
        )
    return IncompatibleKeys(missing, unexpected)


def plain_values(state_dict: Mapping[str, Any]) -> dict[str, Any]:
    """``state_dict`` with every torch tensor as a NumPy array (duck-typed: nbqat never imports
    torch): detached first, so a ``state_dict(keep_vars=True)`` or ``named_parameters()``
    Parameter loads as torch's ``load_state_dict`` takes it, and bfloat16 (which NumPy lacks)
    widened exactly to float32; other values are kept as they are."""
    out = {}
    for k, v in state_dict.items():
        if hasattr(v, "detach") and hasattr(v, "numpy"):
            v = v.detach().cpu()
            v = (v.float() if str(v.dtype) == "torch.bfloat16" else v).numpy()
        out[k] = v
    return out


def checked_param(name: str, value: Any, param: np.ndarray) -> np.ndarray:
    """``value`` as an array of ``param``'s shape and real numbers (cast on assignment, as
    torch's ``copy_``): a CheckpointError for another shape (torch's "size mismatch"), a
    TypeError for complex, string or object values."""
    a = np.asarray(value)
    if a.shape != param.shape:
        raise CheckpointError(
            f"load_state_dict: size mismatch for {name}: the state_dict's shape {a.shape}, "
            f"this model's {param.shape}"
        )
    if a.dtype.kind not in "biuf":
        raise TypeError(f"state_dict[{name!r}] has dtype {a.dtype}; expected real numbers")
    return a


def load_params(params: dict[str, np.ndarray], state_dict: Any, strict: bool) -> IncompatibleKeys:
    """:meth:`nbqat.nn.Module.load_state_dict` over its ``params`` (name: view): every key and
    value checked, then each copied into its view (cast to its dtype)."""
    keys = match_keys(list(params), state_dict, strict)
    state_dict = plain_values(state_dict)
    new = {k: checked_param(k, state_dict[k], p) for k, p in params.items() if k in state_dict}
    for k, v in new.items():
        params[k][...] = v
    return keys
