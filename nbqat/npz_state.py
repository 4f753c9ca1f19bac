"""One checkpoint codec: a nested state as an atomic, validated ``.npz`` archive (no pickles).

The one module that writes or reads ``.npz`` files: every QAT model's ``save`` / ``load``
(:class:`~nbqat.nn.qat.QATTemporalFusionTransformer`, :class:`~nbqat.nn.quantize.QATModel`) and
the main job's ``float.npz`` (its schema is :mod:`nbqat.train.checkpoint_schema`'s, handed in as a
format
name), so that nbqat has one on-disk format::

    save_state("qat.npz", {"params": p, "opt": opt.state_dict()}, format="nbqat.qat")
    state = load_state("qat.npz", format="nbqat.qat")   # the same nested dict back

A state is a tree of dicts (str keys, or all int keys as torch.optim's ``state``), lists,
tuples, NumPy arrays and scalars, Python scalars, strings and None. Arrays become ``.npz``
members ``a0, a1, ...`` (stored uncompressed; the zip CRC of every member is checked on
reading); the tree itself is a JSON manifest member ``__nbqat_manifest__`` with the format name
and version. A file is written to a temporary name
in the destination folder, fsynced and renamed (:func:`nbqat._io.atomic_open`).
"""

from __future__ import annotations

import json
import os
import zipfile
from typing import Any

import numpy as np

from nbqat._io import atomic_open

__all__ = [
    "MANIFEST_KEY",
    "CheckpointError",
    "decode_members",
    "decode_state",
    "encode_state",
    "load_state",
    "read_members",
    "save_state",
]

#: Name of the manifest member of every nbqat ``.npz`` state file.
MANIFEST_KEY = "__nbqat_manifest__"


class CheckpointError(ValueError):
    """A checkpoint is unreadable, corrupt, foreign, or does not fit the model loading it."""


def encode_state(obj: Any, arrays: dict[str, np.ndarray], key: str = "") -> Any:
    """Nested state -> JSON-able tree; arrays and NumPy scalars are moved into ``arrays``.

    Parameters
    ----------
    obj : nested state
        See the module docstring for the types stored.
    arrays : dict
        Receives the arrays as ``{"a<i>": C-contiguous copy}``.
    key : str, optional
        The path of ``obj`` in the state (for error messages).

    Returns
    -------
    dict
        The manifest tree of ``obj``.

    Raises
    ------
    TypeError
        A dict key neither str nor int (a dict's keys are all str or all int), an object
        array, or a value of another type (named with its path).
    """
    if isinstance(obj, dict):
        # int keys (torch.optim's "state": {0: ...}) as an "__int_dict__" of their decimals
        ints = bool(obj) and all(type(k) is int for k in obj)
        out = {}
        for k, v in obj.items():
            if not (ints or isinstance(k, str)):
                raise TypeError(
                    f"checkpoint state keys must be str (or all int), got {k!r} at {key!r}"
                )
            out[str(k)] = encode_state(v, arrays, f"{key}/{k}")
        return {"__int_dict__" if ints else "__dict__": out}
    if isinstance(obj, np.ndarray | np.generic):
        arr = np.asarray(obj)
        if arr.dtype.hasobject:
            raise TypeError(f"object arrays cannot be checkpointed (at {key!r})")
        name = f"a{len(arrays)}"
        arrays[name] = np.array(arr, order="C", copy=True)
        return {"__array__": name, "scalar": isinstance(obj, np.generic)}
    if isinstance(obj, tuple | list):
        kind = "__tuple__" if isinstance(obj, tuple) else "__list__"
        return {kind: [encode_state(v, arrays, f"{key}/{i}") for i, v in enumerate(obj)]}
    if obj is None or isinstance(obj, bool | int | float | str):
        return {"__value__": obj}
    raise TypeError(
        f"cannot checkpoint a {type(obj).__name__} at {key!r}: only dicts, arrays, NumPy and "
        "Python scalars, strings, None, lists and tuples are stored (no pickles)"
    )


def decode_state(node: Any, arrays: dict[str, np.ndarray]) -> Any:
    """The inverse of :func:`encode_state`.

    Parameters
    ----------
    node : dict
        A manifest tree.
    arrays : dict
        The archive's array members.

    Returns
    -------
    nested state
        The object :func:`encode_state` was given (tuples stay tuples, scalars stay scalars).

    Raises
    ------
    CheckpointError
        An unknown node kind or a missing array member.
    """
    if not isinstance(node, dict) or not node:
        raise CheckpointError("corrupt checkpoint manifest (unexpected node)")
    if "__dict__" in node:
        return {k: decode_state(v, arrays) for k, v in node["__dict__"].items()}
    if "__int_dict__" in node:
        return {int(k): decode_state(v, arrays) for k, v in node["__int_dict__"].items()}
    if "__array__" in node:
        name = node["__array__"]
        if name not in arrays:
            raise CheckpointError(f"corrupt checkpoint: array member {name!r} is missing")
        arr = arrays[name]
        return arr[()] if node.get("scalar") else arr
    if "__tuple__" in node:
        return tuple(decode_state(v, arrays) for v in node["__tuple__"])
    if "__list__" in node:
        return [decode_state(v, arrays) for v in node["__list__"]]
    if "__value__" in node:
        return node["__value__"]
    raise CheckpointError("corrupt checkpoint manifest (unknown node kind)")


def save_state(path: str | os.PathLike, state: dict, *, format: str, version: int = 1) -> None:
    """Write ``state`` to ``path`` (exactly that name), atomically.

    Parameters
    ----------
    path : str or os.PathLike
        Destination; a temporary file in the same folder is fsynced and renamed over it (an
        interrupted save never leaves a partial file under that name).
    state : dict
        The nested state (see the module docstring).
    format : str
        The format name stored in the manifest (``"nbqat.qat"`` for QAT models).
    version : int, default 1
        The format version stored in the manifest.

    Raises
    ------
    TypeError
        A value that cannot be stored (:func:`encode_state`).
    OSError
        The destination cannot be written (no temporary file is left behind).
    """
    arrays: dict[str, np.ndarray] = {}
    tree = encode_state(state, arrays)
    manifest = json.dumps({"format": format, "version": version, "state": tree})
    members = dict(arrays)
    members[MANIFEST_KEY] = np.frombuffer(manifest.encode("utf-8"), dtype=np.uint8)
    with atomic_open(os.fspath(path), "wb", prefix=".nbqat-ckpt-") as f:
        np.savez(f, **members)  # type: ignore[arg-type]


def read_members(path: str | os.PathLike) -> dict[str, np.ndarray]:
    """Every member of the ``.npz`` archive ``path`` (each read and CRC-checked; no pickles).

    Parameters
    ----------
    path : str or os.PathLike

    Returns
    -------
    dict of str -> ndarray
        The raw members, the manifest included (:func:`decode_members` reads them as a state;
        a reader of an older, manifest-free layout reads them directly).

    Raises
    ------
    FileNotFoundError
        ``path`` does not exist.
    CheckpointError
        A truncated or corrupt file, or not an ``.npz`` archive.
    """
    path = os.fspath(path)
    if not os.path.exists(path):
        raise FileNotFoundError(f"checkpoint {path!r} does not exist")
    try:
        with np.load(path, allow_pickle=False) as npz:
            return {name: npz[name] for name in npz.files}
    except (zipfile.BadZipFile, EOFError, OSError, ValueError, KeyError) as e:
        raise CheckpointError(
            f"{path!r} is not a readable nbqat checkpoint (a corrupt or truncated file, or not "
            f"an .npz archive): {type(e).__name__}: {e}"
        ) from e


#: The old private name.
_read_members = read_members


def decode_members(
    members: dict[str, np.ndarray], path: str | os.PathLike, *, format: str, version: int = 1
) -> Any:
    """The state held by :func:`read_members`'s ``members`` (checked as :func:`load_state`).

    Parameters
    ----------
    members : dict of str -> ndarray
        Not modified.
    path : str or os.PathLike
        The file they came from (for error messages).
    format : str
    version : int, default 1

    Returns
    -------
    nested state
        As :func:`load_state` returns it for the file.

    Raises
    ------
    CheckpointError
        No manifest (a foreign file), a corrupt manifest, another format name or version.
    """
    path = os.fspath(path)
    members = dict(members)
    if MANIFEST_KEY not in members:
        raise CheckpointError(
            f"{path!r} is an .npz archive but not an nbqat checkpoint (no {MANIFEST_KEY!r} "
            "member): a foreign file"
        )
    try:
        manifest = json.loads(members.pop(MANIFEST_KEY).tobytes().decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CheckpointError(f"{path!r} has a corrupt manifest: {e}") from e
    fmt = manifest.get("format") if isinstance(manifest, dict) else None
    if fmt != format:
        raise CheckpointError(f"{path!r} is a {fmt!r} file, not a {format!r} checkpoint")
    if manifest.get("version") != version:
        raise CheckpointError(
            f"{path!r} has checkpoint format version {manifest.get('version')!r}; this nbqat "
            f"reads version {version}"
        )
    return decode_state(manifest.get("state"), members)


def load_state(path: str | os.PathLike, *, format: str, version: int = 1) -> Any:
    """Read a state written by :func:`save_state` (every member is read and CRC-checked).

    Parameters
    ----------
    path : str or os.PathLike
    format : str
        The format name the file must carry.
    version : int, default 1
        The version the file must carry.

    Returns
    -------
    nested state
        As saved (tuples stay tuples, NumPy scalars stay scalars).

    Raises
    ------
    FileNotFoundError
        ``path`` does not exist.
    CheckpointError
        A truncated or corrupt file, an ``.npz`` without the manifest (a foreign file), another
        format name or version.
    """
    return decode_members(read_members(path), path, format=format, version=version)
