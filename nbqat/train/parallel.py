"""What the main job does with its process group (``mpiexec -n N nbqat train``).

One :class:`Parallel` per run wraps the :class:`nbqat.distributed.ProcessGroup`; with one
process every method reduces to the single-process code path (the same bits as before MPI
support existed). Under ``mpiexec -n N``:

* every rank draws the same seeded window order; each training step takes the GLOBAL batch,
  and :func:`nbqat.distributed.data_parallel_step` trains on this rank's slice
  (:func:`nbqat.distributed.shard`) with the gradients summed through the step's
  ``grad_hook``, weighted to the global-batch mean, and clipped on the reduced gradients;
* dropout masks are drawn for the global batch and sliced by this rank's rows
  (:attr:`nbqat.nn.Dropout.rows`), so a rank drops exactly what the 1-process run drops;
* calibration forwards this rank's slice through observers kept in sync
  (:func:`nbqat.distributed.calibrate`);
* evaluation splits the streamed prediction batches over the ranks and gathers them in order
  (the same batches as one process: the same bits);
* a stop (Ctrl-C, ``--stop-after-steps``) is agreed by all ranks after every step, and any
  error on one rank ends every rank (:meth:`Parallel.guard`).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import numpy as np

from nbqat import distributed as dist

__all__ = ["Parallel", "set_dropout_rows"]


def set_dropout_rows(model: Any, rows: tuple[int, int, int] | None) -> None:
    """Draw ``model``'s dropout masks for a global batch and keep this rank's rows.

    Parameters
    ----------
    model : Module
    rows : (global_rows, start, stop) or None
        None: masks of the local batch's own shape (one process).
    """
    from nbqat.nn.layers.dropout import Dropout

    for mod in model.modules():
        if isinstance(mod, Dropout):
            mod.rows = rows


class Parallel:
    """The run's process group and the main job's collectives.

    Parameters
    ----------
    group : nbqat.distributed.ProcessGroup
        :func:`nbqat.distributed.init_process_group`'s group.

    Attributes
    ----------
    group : ProcessGroup
    rank, size : int
    root : bool
        True on rank 0, the only rank that writes files or prints progress.
    local_only : bool
        While True (see :meth:`alone`), :meth:`predict_batches` computes every batch here.
    """

    def __init__(self, group: dist.ProcessGroup) -> None:
        self.group = group
        self.rank = group.rank
        self.size = group.size
        self.root = group.rank == 0
        self.local_only = False

    @property
    def distributed(self) -> bool:
        """True with more than one process."""
        return self.size > 1

    def step(
        self, model: Any, dropout_model: Any, batch: Sequence[np.ndarray], opt: Any, max_norm: Any
    ) -> tuple[float, float]:
        """One training step on the global ``batch`` (this rank trains on its slice).

        Parameters
        ----------
        model : forecaster or QAT model
        dropout_model : Module
            The module tree holding the dropout layers (the float model).
        batch : (static, historical, future, target)
            The global batch.
        opt : optimizer over ``model.params``
        max_norm : float or None

        Returns
        -------
        (loss, total_norm) : (float, float)
            The global-batch loss and gradient norm, identical on every rank.
        """
        rows = len(batch[0])
        if self.distributed:
            sl = dist.shard(rows, self.group)
            set_dropout_rows(dropout_model, (rows, sl.start, sl.stop))
        try:
            return dist.data_parallel_step(model, batch, opt, self.group, max_norm=max_norm)
        finally:
            if self.distributed:
                set_dropout_rows(dropout_model, None)

    def agree(self, flag: bool) -> bool:
        """True on every rank when ``flag`` is True on any rank (one tiny allreduce)."""
        if not self.distributed:
            return flag
        buf = np.array([1.0 if flag else 0.0])
        return bool(self.group.allreduce_sum(buf)[0] > 0)

    def predict_batches(self, n_batches: int, one: Callable[[int], np.ndarray]) -> list:
        """``[one(0), ..., one(n_batches - 1)]``: contiguous runs of batches per rank, gathered.

        Parameters
        ----------
        n_batches : int
        one : callable int -> ndarray
            The prediction of batch ``i`` (the same batches on every rank).

        Returns
        -------
        list of ndarray
            Every batch's prediction, in order, on every rank.
        """
        if not self.distributed or self.local_only:
            return [one(i) for i in range(n_batches)]
        mine = range(n_batches)[dist.shard(n_batches, self.group)]
        parts = self.group.allgather([one(i) for i in mine])
        return [p for part in parts for p in part]

    @contextmanager
    def alone(self) -> Iterator[None]:
        """A block run by one rank only: predictions there are computed locally."""
        old, self.local_only = self.local_only, True
        try:
            yield
        finally:
            self.local_only = old

    def barrier(self) -> None:
        """Wait for every rank (nothing with one process)."""
        if self.distributed:
            self.group.barrier()

    @contextmanager
    def guard(self) -> Iterator[None]:
        """Any error on this rank ends every rank with ``nbqat: rank R of N failed: ...``.

        The traceback is printed too, except for a user error (bad options or data: a
        ValueError or FileNotFoundError, whose message says what to fix). ``MPI_Abort`` then
        ends every rank with exit status 1; a Ctrl-C outside the training steps (the
        evaluation: ``KeyboardInterrupt``) with ``nbqat: rank R of N interrupted`` and status
        130, as one process. ``TrainingInterrupted`` passes through (every rank
        agreed on the stop). With one process nothing changes.
        """
        from nbqat.train.config import TrainingInterrupted

        try:
            yield
        except TrainingInterrupted:
            raise
        except BaseException as e:
            if not self.distributed:
                raise
            import traceback

            msg = f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
            stop = isinstance(e, KeyboardInterrupt)  # Ctrl-C outside the steps: status 130
            what = "interrupted (Ctrl-C; the checkpoint resumes it)" if stop else f"failed: {msg}"
            # The one-line message first and flushed: MPI_Abort may cut what follows.
            print(f"nbqat: rank {self.rank} of {self.size} {what}", file=sys.stderr)
            sys.stderr.flush()
            if not isinstance(e, (ValueError, FileNotFoundError, KeyboardInterrupt)):
                traceback.print_exc()  # not a user error
            self.group.abort(130 if stop else 1)
            raise

    def default_threads(self) -> int | None:
        """Numba threads per rank under MPI: this process's CPUs shared by the host's ranks.

        Returns
        -------
        int or None
            None with one process (Numba's default stays).
        """
        if not self.distributed:
            return None
        local = int(os.environ.get("MPI_LOCALNRANKS", self.size))
        cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
        return max(1, (cpus or 1) // max(1, local))
