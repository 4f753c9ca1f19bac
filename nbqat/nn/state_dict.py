"""The checks of a ``state_dict`` against a model's parameters (torch's ``load_state_dict``
rules), shared by :meth:`nbqat.nn.Module.load_state_dict` and the QAT models'
(:mod:`nbqat.nn.qat_state_dict`): every key and value is checked before the first write."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np

from nbqat.npz_state import CheckpointError

__all__ = ["IncompatibleKeys", "checked_param", "match_keys"]


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
