"""Checks that the ranks of a data-parallel step run the same step (:mod:`nbqat.distributed`).

Every rank must hold the same global batch and the same parameters before a step: a rank fed
another data file, another global batch size or a model built with another seed or shape
otherwise trains silently on a mixture (or MPI fails on a truncated message, the gradient
buffers' sizes differing). One small allgather of a fixed-length fingerprint per step tells,
and every rank raises the same ``ValueError`` before any other collective.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from typing import Any

import numpy as np


def _crc(arrays: Sequence[Any]) -> float:
    """CRC-32 of the arrays' dtypes, shapes and bytes, chained (exact in float64); a CUDA
    device array enters by its dtype and shape only (no copy to the host)."""
    from nbqat import _cuda

    crc = 0
    for a in arrays:
        on_device = _cuda.is_cuda_array(a)
        a = a if on_device else np.ascontiguousarray(a)
        crc = zlib.crc32(f"{np.dtype(a.dtype).str}{tuple(a.shape)}".encode(), crc)
        if not on_device:
            crc = zlib.crc32(a.reshape(-1).view(np.uint8).data, crc)
    return float(crc)


def fingerprint(model: Any, batch: Sequence[Any]) -> np.ndarray:
    """``[items, rows, crc of the batch, parameters, crc of the parameters]`` (float64)."""
    params = getattr(model, "params", None)
    size = float(np.size(params)) if params is not None else -1.0
    crc = _crc([params]) if params is not None else -1.0
    rows = float(np.shape(batch[0])[0]) if len(batch) else -1.0
    return np.array([len(batch), rows, _crc(batch), size, crc], np.float64)


def check_ranks_agree(model: Any, batch: Sequence[Any], group: Any, who: str) -> None:
    """Raise on every rank at once unless every rank holds the same batch and parameters
    and the batch has a row for every rank.

    Parameters
    ----------
    model : model with ``params`` (a flat buffer)
    batch : sequence of ndarray
        This rank's GLOBAL batch (the same on every rank); empty: this rank has no more.
    group : ProcessGroup
        Nothing is checked for a single process.
    who : str
        The caller, for the message.

    Raises
    ------
    ValueError
        The ranks' batches (item count, rows or values) or parameters (count or values)
        differ (e.g. a rank reading another data file, or a model built with another seed),
        or the global batch has fewer rows than processes.
    """
    if group.distributed:
        _agree(model, batch, group, who)
    if not len(batch):  # the end of a rank's batches (calibrate)
        return
    rows = int(np.shape(batch[0])[0])
    if rows < group.size:
        raise ValueError(
            f"{who}: the global batch has {rows} rows, fewer than the {group.size} processes "
            "(a rank would get an empty slice): drop the last partial batch, or pass global "
            "batches of at least group.size rows"
        )


def _agree(model: Any, batch: Sequence[Any], group: Any, who: str) -> None:
    """The fingerprints' comparison of :func:`check_ranks_agree`."""
    batch_what = ("batch items (0: no batch left)", "global batch rows", "global batch values")
    what = (*batch_what, "parameter count")
    fix = (
        "every rank must pass the same global batch and start from the same parameters (the "
        "same data, seed and model configuration on every rank)"
    )
    agree(group, fingerprint(model, batch), (*what, "parameter values"), who, fix, shown=what)


def agree(
    group: Any,
    values: np.ndarray,
    names: Sequence[str],
    who: str,
    fix: str,
    shown: Sequence[str] = (),
) -> np.ndarray:
    """Allgather a fixed-length fingerprint and raise the same error on every rank unless
    every rank sent the same one (so no rank runs on into a collective the others skip, or
    into a message of another length).

    Parameters
    ----------
    group : ProcessGroup
        A distributed group (every rank must call this, at the same point).
    values : ndarray
        (k,) float64 (the same k on every rank): the values compared, one per name, then any
        payload that travels along (not compared).
    names : sequence of str
        What each compared value stands for, for the message.
    who, fix : str
        The caller, and what the user must change, for the message.
    shown : sequence of str
        The names whose per-rank values the message lists (the first differing one).

    Returns
    -------
    ndarray
        (size, k) float64: every rank's values, in rank order.

    Raises
    ------
    ValueError
        On every rank at once, naming the values that differ between the ranks.
    """
    parts = group.allgather_array(np.asarray(values, np.float64))
    bad = [n for n, col in zip(names, parts.T) if np.any(col != col[0])]
    if bad:
        first = list(names).index(bad[0])
        per_rank = f" { ({bad[0]: parts[:, first].tolist()}) }" if bad[0] in shown else ""
        raise ValueError(
            f"{who}: the ranks disagree on the {' and the '.join(bad)}{per_rank}: {fix}"
        )
    return parts
