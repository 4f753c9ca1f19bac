"""The main job's ``float.npz`` (float weights, best weights, optimizer state) on the one
codec, :mod:`nbqat.npz_state`; re-exported by :mod:`nbqat.train.checkpoint_schema`, whose schema it
is.

New files are ``npz_state`` files of format :data:`FLOAT_FORMAT`; the manifest-free layout of
earlier releases (members ``params``, ``best_params``, ``opt.<a/0/b>``) still loads.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

import numpy as np

from nbqat import npz_state
from nbqat.npz_state import CheckpointError

__all__ = ["FLOAT_FORMAT", "load_float_state", "read_float_arrays", "write_float_arrays"]

#: :mod:`nbqat.npz_state` format name of ``float.npz``.
FLOAT_FORMAT = "nbqat.train.float"


def _err(file: Path, field: str, what: str) -> CheckpointError:
    return CheckpointError(f"{file}: field {field!r}: {what}")


def write_float_arrays(
    path: str | os.PathLike, params: np.ndarray, best_params: np.ndarray | None, opt: Any
) -> None:
    """Write ``float.npz`` (atomically, :func:`nbqat.npz_state.save_state`).

    Parameters
    ----------
    path : str or os.PathLike
    params : (n_params,) float32 ndarray
        The current float weights (host copy).
    best_params : (n_params,) float32 ndarray or None
        The best-validation weights (None: not yet evaluated).
    opt : dict or None
        The optimizer's ``state_dict()`` (host arrays), or None.
    """
    state: dict[str, Any] = {"params": params}
    if best_params is not None:
        state["best_params"] = best_params
    if opt is not None:
        state["opt"] = opt
    npz_state.save_state(path, state, format=FLOAT_FORMAT)


def load_float_state(path: str | os.PathLike) -> dict[str, Any]:
    """The content of a ``float.npz`` (either layout), checked for missing and unknown members.

    Parameters
    ----------
    path : str or os.PathLike
        A run's ``checkpoint/float.npz`` (either layout).

    Returns
    -------
    dict
        ``{"params", "best_params" (when saved), "opt" (when saved: the optimizer's nested
        ``state_dict``)}``.

    Raises
    ------
    CheckpointError
        Naming the file and the member: unreadable, missing ``params``, an unknown member.
    """
    file = Path(path)
    if not file.is_file():
        raise _err(file, "(file)", "missing")
    try:
        members = npz_state.read_members(file)
    except CheckpointError as e:
        raise CheckpointError(f"{file}: unreadable (truncated or corrupt?): {e}") from None
    if npz_state.MANIFEST_KEY in members:
        state = npz_state.decode_members(members, file, format=FLOAT_FORMAT)
        unknown = sorted(k for k in state if k not in ("params", "best_params", "opt"))
    else:  # nbqat 0.x: flat members, the optimizer state under "opt.<path>"
        unknown = sorted(
            k for k in members if k not in ("params", "best_params") and k[:4] != "opt."
        )
        opt = _unflatten({k[4:]: v for k, v in members.items() if k[:4] == "opt."})
        state = {k: v for k, v in members.items() if k in ("params", "best_params")}
        if opt:
            state["opt"] = opt
    if unknown:
        raise _err(file, unknown[0], "unknown member")
    if "params" not in state:
        raise _err(file, "params", "missing member")
    return state


def _unflatten(flat: dict[str, np.ndarray]) -> dict:
    """The nested optimizer state of an nbqat 0.x ``float.npz`` (``{"a/0/b": array}``; lists
    keep their length under ``<path>/__list__``; 0-d arrays become Python scalars)."""
    root: dict = {}
    for key, v in flat.items():
        *parents, leaf = key.split("/")
        node = root
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = v

    def fix(node: Any) -> Any:
        if not isinstance(node, dict):
            return node.item() if node.ndim == 0 else node
        if "__list__" in node:
            return [fix(node[str(i)]) for i in range(int(node["__list__"]))]
        return {k: fix(v) for k, v in node.items()}

    return fix(root)


def read_float_arrays(ck: str | Path, n_params: int, state: dict) -> dict[str, Any]:
    """Read and validate ``ck/float.npz`` (every member, CRC-checked); nothing is written.

    Parameters
    ----------
    ck : str or Path
        The checkpoint folder.
    n_params : int
        The parameter count of the model the configuration builds.
    state : dict
        The validated ``state`` of :func:`read_state` (``best_epoch`` says whether
        ``best_params`` must be there).

    Returns
    -------
    dict
        :func:`load_float_state`'s ``{"params", "best_params" (when saved), "opt" (when
        saved)}``: float32 (n_params,) arrays and the optimizer state.

    Raises
    ------
    CheckpointError
        Naming the file and the member for a truncated file, a missing or unknown member, or
        arrays that do not fit a model of ``n_params`` parameters.
    """
    file = Path(ck) / "float.npz"
    arrays = load_float_state(file)
    if math.isfinite(state["best_val"]) and "best_params" not in arrays:
        raise _err(file, "best_params", f"missing, but state.best_val is {state['best_val']}")
    for k in ("params", "best_params"):
        if k in arrays:
            a = arrays[k]
            if (
                not isinstance(a, np.ndarray)
                or a.ndim != 1
                or a.size != n_params
                or a.dtype != np.float32
            ):
                raise _err(
                    file,
                    k,
                    f"{getattr(a, 'dtype', type(a).__name__)} shape {np.shape(a)}, but the model "
                    f"of this configuration has {n_params} float32 parameters (a checkpoint of "
                    "another model size?)",
                )
            if not np.all(np.isfinite(a)):
                raise _err(file, k, "holds non-finite values")
    return arrays
