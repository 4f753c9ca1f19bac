"""Data-parallel training and calibration over MPI (mpi4py), with observers kept in sync.

A :class:`ProcessGroup` gives rank, size, an allreduce, a broadcast, an allgather and an abort:
:func:`init_process_group` returns mpi4py's ``COMM_WORLD`` (:class:`MPIProcessGroup`) under
``mpiexec`` with several processes, else the single-process fallback (every collective the
identity), so the same code runs with and without MPI. No home-made transport.

How a data-parallel run stays exact (llm.c's scheme on nbqat's flat buffers):

* every rank draws the same seeded window order and takes its contiguous slice of each global
  batch (:func:`shard`);
* observers: each quantizer's batch statistics (finite min/max and the non-finite counts) are
  gathered from every rank and combined in rank order *before* the observer's (moving-average)
  update (:func:`sync_observers`, :meth:`ProcessGroup.combine_minmax_stats`), so every rank
  holds the qparams that one observer fed the whole global batch would hold, at every step, in
  calibration and in QAT alike (torch's DDP leaves each replica's observers on its own shard and
  then overwrites them with rank 0's, pytorch#85627);
* gradients: each rank's gradient (the mean over its slice) is weighted by ``b_r / B`` and the
  flat gradient buffer is summed with ONE allreduce per step (:func:`allreduce_gradients`, the
  training step's ``grad_hook``), so every rank holds the global-batch mean (LSQ activation
  quantizers take the global batch's gradient factor, ``QATPhases.sharded``); the norm for
  ``clip_grad_norm_`` is then the global norm, identical on every rank, and the fused optimizer
  update keeps the parameters identical everywhere.

A float sum depends on its order: an N-process run equals the 1-process run to rounding (1e-5
relative in the tests); two runs with the same N give identical bits. CUDA device arrays are
staged through the host (the MPICH wheel is not CUDA-aware): ``last_transport`` says which.
"""

from __future__ import annotations

import contextlib
import functools
import os
import sys
import time
import zlib
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np

from nbqat._dist_agree import agree

__all__ = [
    "MPIProcessGroup", "ProcessGroup", "allreduce_gradients", "calibrate", "data_parallel_step",
    "init_process_group", "install_abort_handler", "shard", "sync_observers",
]  # fmt: skip

#: Environment variables that process managers set in every rank (MPICH/hydra, Open MPI, PMIx).
_MPI_ENV = ("PMI_RANK", "PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "MPI_LOCALNRANKS")


class ProcessGroup:
    """The single-process group: rank 0 of 1, every collective returns its input.

    Attributes
    ----------
    rank : int
    size : int
    backend : str
        ``"single"`` here, ``"mpi"`` for :class:`MPIProcessGroup`.
    last_transport : str
        ``"none"`` (no collective yet or a single process), ``"host"`` (NumPy buffers, or CUDA
        arrays staged through the host) or ``"device"`` (a CUDA-aware MPI).
    """

    backend = "single"

    def __init__(self) -> None:
        self.rank, self.size, self.last_transport = 0, 1, "none"

    @property
    def distributed(self) -> bool:
        """True when more than one process takes part."""
        return self.size > 1

    def __deepcopy__(self, memo: dict) -> ProcessGroup:
        return self  # a handle shared by every observer that holds it

    def allreduce_sum(self, buf: np.ndarray) -> np.ndarray:
        """Sum ``buf`` over all ranks, in place.

        Parameters
        ----------
        buf : ndarray, C-contiguous, float32/float64 (or a CUDA device array)

        Returns
        -------
        the same ``buf``, now holding the sum
        """
        return buf

    def broadcast(self, buf: np.ndarray, root: int = 0) -> np.ndarray:
        """Overwrite ``buf`` on every rank with rank ``root``'s, in place; returns ``buf``."""
        return buf

    def allgather(self, obj: Any) -> list[Any]:
        """A list of every rank's (small, picklable) ``obj``, in rank order."""
        return [obj]

    def allgather_array(self, a: np.ndarray) -> np.ndarray:
        """Every rank's 1-D float64 ``a`` (same length on every rank), stacked (size, n)."""
        return np.asarray(a, np.float64)[None, :]

    def barrier(self) -> None:
        """Wait for every rank."""

    def abort(self, code: int = 1) -> None:
        """End every rank of the run with exit status ``code``."""
        raise SystemExit(code)

    def combine_minmax_stats(
        self, stats: Sequence[np.ndarray], who: str, config: tuple = ()
    ) -> tuple[np.ndarray, ...]:
        """Combine observer batch statistics over ranks (rank order; exact).

        Parameters
        ----------
        stats : (fmin, fmax, n_nan, n_pinf, n_ninf)
            This rank's per-channel (C,) finite minimum and maximum (float32; ``+inf``/``-inf``
            where a channel has no finite value or the batch is empty) and non-finite counts.
        who : str
            The observer, for the error message.
        config : tuple
            The observer's settings that shape its next collectives (a histogram's bins).

        Returns
        -------
        (fmin, fmax, n_nan, n_pinf, n_ninf)
            Minimum of the minima, maximum of the maxima and summed counts over all ranks: the
            statistics of the global batch, identical on every rank.

        Raises
        ------
        ValueError
            On every rank at once when the ranks disagree on the channel count, ``who``, ``config``.
        """
        if not self.distributed:
            return tuple(stats)
        c, names = int(np.size(stats[0])), ("channel count", "observer type or configuration")
        # [fmin (C), fmax (C), counts (3C)], float64 (exact for float32 values and counts)
        data = np.concatenate([np.ravel(s).astype(np.float64) for s in stats])
        # first a fixed length, [C, kind, a per-tensor observer's 5 values]: other lengths end
        # in MPI ("Message truncated"), another kind runs other collectives next (a hang)
        kind = zlib.crc32(f"{who}{tuple(config)}".encode())
        first = np.concatenate([[c, kind], data if c == 1 else np.zeros(5)])
        fix = "every rank must run the same model and quantization configuration on same batches"
        parts = agree(self, first, names, who, fix, shown=names[:1])[:, 2:]
        v = (parts if c == 1 else self.allgather_array(data)).reshape(self.size, 5, c)
        fmin = np.minimum.reduce(v[:, 0], axis=0).astype(np.float32)
        fmax = np.maximum.reduce(v[:, 1], axis=0).astype(np.float32)
        counts = [v[:, i].sum(axis=0).astype(np.int64) for i in (2, 3, 4)]
        return (fmin, fmax, *counts)


class MPIProcessGroup(ProcessGroup):
    """A :class:`ProcessGroup` over an mpi4py communicator (default ``MPI.COMM_WORLD``).

    Parameters
    ----------
    comm : mpi4py.MPI.Comm, optional
        The communicator; default ``COMM_WORLD``.

    Notes
    -----
    ``Allreduce`` moves NumPy buffers without copies. A CUDA device array is passed to MPI
    directly only when ``NBQAT_CUDA_AWARE_MPI=1`` says that the MPI library is CUDA-aware
    (mpi4py's ``demo/cuda-aware-mpi``); otherwise it is copied to the host, reduced, and
    copied back.
    """

    backend = "mpi"

    def __init__(self, comm: Any = None) -> None:
        from mpi4py import MPI

        self._MPI = MPI
        self.comm = MPI.COMM_WORLD if comm is None else comm
        self.rank = self.comm.Get_rank()
        self.size = self.comm.Get_size()
        self.last_transport = "none"

    def allreduce_sum(self, buf: Any) -> Any:
        from nbqat import _cuda

        if _cuda.is_cuda_array(buf):
            if os.environ.get("NBQAT_CUDA_AWARE_MPI") == "1":
                self.comm.Allreduce(self._MPI.IN_PLACE, buf, op=self._MPI.SUM)
                self.last_transport = "device"
                return buf
            host = np.ascontiguousarray(buf.copy_to_host())
            self.comm.Allreduce(self._MPI.IN_PLACE, host, op=self._MPI.SUM)
            buf.copy_to_device(host)
            self.last_transport = "host"
            return buf
        if not (isinstance(buf, np.ndarray) and buf.flags.c_contiguous):
            raise TypeError("allreduce_sum: buf must be a C-contiguous NumPy or CUDA array")
        self.comm.Allreduce(self._MPI.IN_PLACE, buf, op=self._MPI.SUM)
        self.last_transport = "host"
        return buf

    def broadcast(self, buf: np.ndarray, root: int = 0) -> np.ndarray:
        self.comm.Bcast(buf, root=root)
        return buf

    def allgather(self, obj: Any) -> list[Any]:
        return list(self.comm.allgather(obj))

    def allgather_array(self, a: np.ndarray) -> np.ndarray:
        send = np.ascontiguousarray(a, np.float64)
        recv = np.empty((self.size, send.size), np.float64)
        self.comm.Allgather(send, recv)
        return recv

    def barrier(self) -> None:
        self.comm.Barrier()

    def abort(self, code: int = 1) -> None:
        sys.stdout.flush()
        sys.stderr.flush()
        time.sleep(0.2)  # let mpiexec forward this rank's last output before it kills the job
        self.comm.Abort(code)


_GROUP: ProcessGroup | None = None


def init_process_group(backend: str = "auto") -> ProcessGroup:
    """The process group of this program (created once, then returned again).

    Parameters
    ----------
    backend : {"auto", "mpi", "single"}, default "auto"
        ``"auto"``: MPI when the process was started by ``mpiexec`` (its environment says so)
        and mpi4py is installed, else the single-process group. ``"mpi"`` requires mpi4py.

    Returns
    -------
    ProcessGroup
        An :class:`MPIProcessGroup` with ``size > 1`` under ``mpiexec -n N`` (N > 1), else a
        single-process :class:`ProcessGroup`.

    Raises
    ------
    ValueError
        An unknown ``backend``.
    ImportError
        ``backend="mpi"`` without mpi4py (``pip install "nbqat[distributed]"``).
    """
    global _GROUP
    if backend not in ("auto", "mpi", "single"):
        raise ValueError(f"backend must be 'auto', 'mpi' or 'single', got {backend!r}")
    if _GROUP is not None and (backend == "auto" or _GROUP.backend == backend):
        return _GROUP
    group: ProcessGroup = ProcessGroup()
    if backend == "mpi" or (backend == "auto" and any(v in os.environ for v in _MPI_ENV)):
        try:
            group = MPIProcessGroup()
        except ImportError:
            if backend == "mpi":
                raise ImportError(
                    "backend='mpi' needs mpi4py: pip install 'nbqat[distributed]'"
                ) from None
        if backend == "auto" and group.size == 1:
            group = ProcessGroup()
    _GROUP = group
    return group


def install_abort_handler(group: ProcessGroup) -> None:
    """Make an uncaught exception on any rank end every rank (never a hang).

    The failing rank prints ``nbqat: rank R of N failed: <error>`` and calls
    :meth:`ProcessGroup.abort`; ``mpiexec`` then ends the other ranks with a non-zero status.

    Parameters
    ----------
    group : ProcessGroup
        Nothing is installed for a single process.
    """
    if not group.distributed:
        return
    previous = sys.excepthook

    def hook(kind: type[BaseException], exc: BaseException, tb: Any) -> None:
        print(f"nbqat: rank {group.rank} of {group.size} failed: {exc}", file=sys.stderr)
        sys.stderr.flush()  # the message first: MPI_Abort may cut what follows
        previous(kind, exc, tb)
        group.abort(1)

    sys.excepthook = hook


def shard(global_batch: int, group: ProcessGroup) -> slice:
    """This rank's contiguous slice of a global batch of ``global_batch`` rows.

    Parameters
    ----------
    global_batch : int
        Rows of the global batch (>= 0).
    group : ProcessGroup

    Returns
    -------
    slice
        ``numpy.array_split``'s split: the first ``global_batch % size`` ranks take one row
        more. A rank may get an empty slice when ``global_batch < size``.

    Raises
    ------
    TypeError
        ``global_batch`` is not an integer.
    ValueError
        ``global_batch`` is negative.
    """
    from nbqat._validate import check_int

    rows = check_int(global_batch, "global_batch")
    if rows < 0:
        raise ValueError(f"shard: `global_batch` must be >= 0 (a row count), got {rows}")
    n, r = divmod(rows, group.size)
    start = group.rank * n + min(group.rank, r)
    return slice(start, start + n + (1 if group.rank < r else 0))


def sync_observers(quantizers: Any, group: ProcessGroup | None) -> int:
    """Keep these quantizers' observers identical on every rank.

    Parameters
    ----------
    quantizers : mapping or iterable of FakeQuantize / LearnableFakeQuantize / observers
        E.g. ``qat.fake_quants`` of a :class:`~nbqat.nn.qat.QATTemporalFusionTransformer`.
    group : ProcessGroup or None
        None detaches them (each process observes its own data again).

    Returns
    -------
    int
        How many observers were attached.
    """
    items: Iterable[Any] = quantizers.values() if hasattr(quantizers, "values") else quantizers
    n = 0
    for q in items:
        obs = getattr(q, "activation_post_process", q)
        if not hasattr(obs, "process_group"):
            raise TypeError(f"sync_observers: {type(q).__name__} has no mergeable observer")
        obs.process_group = group if group is not None and group.distributed else None
        n += 1
    return n


def allreduce_gradients(
    grads: Sequence[np.ndarray], local_rows: int, global_rows: int, group: ProcessGroup
) -> None:
    """Turn each rank's slice-mean gradients into the global-batch mean, in place.

    Parameters
    ----------
    grads : sequence of ndarray
        The flat gradient buffer first (C-contiguous), then any small extra gradients (LSQ
        scales and zero points); all float32 or all float64.
    local_rows, global_rows : int
        This rank's rows and the global batch's rows.
    group : ProcessGroup

    Notes
    -----
    ``g = sum_r (b_r / B) g_r``: one allreduce of the flat buffer (the extras, if any, travel
    in the same message, appended to a staging copy).
    """
    if not group.distributed:
        return
    w = grads[0].dtype.type(local_rows / global_rows)
    if len(grads) == 1:
        grads[0] *= w
        group.allreduce_sum(grads[0])
        return
    sizes = [g.size for g in grads]
    buf = np.concatenate([np.ravel(g) for g in grads]) * w
    group.allreduce_sum(buf)
    off = 0
    for g, n in zip(grads, sizes):
        g.reshape(-1)[...] = buf[off : off + n]
        off += n


def data_parallel_step(
    model: Any,
    batch: Sequence[np.ndarray],
    optimizer: Any,
    group: ProcessGroup,
    *,
    max_norm: float | None = None,
    step: Callable[..., tuple[float, float]] | None = None,
) -> tuple[float, float]:
    """One data-parallel training step on this rank's slice of a global batch.

    Parameters
    ----------
    model : forecaster or QAT model
        Its active dropout layers draw the global batch's masks and keep this rank's rows.
    batch : (static, historical, future, target[, mask])
        The GLOBAL batch, identical on every rank (each rank takes :func:`shard` of it).
    optimizer : nbqat optimizer over ``model.params``
    group : ProcessGroup
    max_norm : float or None
        ``clip_grad_norm_`` threshold on the global gradient norm.
    step : callable, optional
        The single-process step to run (default :func:`nbqat.nn.train_step`), called as
        ``step(model, local_batch, optimizer, max_norm=..., grad_hook=...)``.

    Returns
    -------
    (loss, total_norm) : (float, float)
        The global-batch mean loss and the global gradient norm before clipping, identical on
        every rank.

    Raises
    ------
    ValueError
        Ranks holding different global batches or parameters, a global batch of fewer rows
        than processes, or activation observers of ``model`` that run unsynced over the ranks
        (see :func:`sync_observers`): raised on every rank at once, before any collective.
    """
    from nbqat._dist_agree import check_ranks_agree
    from nbqat.nn.layers.dropout import global_masks
    from nbqat.nn.step import loss_weight, train_step

    check_ranks_agree(model, batch, group, "data_parallel_step")
    run = train_step if step is None else step
    rows = int(np.shape(batch[0])[0])
    sl = shard(rows, group)
    local, n_local = tuple(a[sl] for a in batch), sl.stop - sl.start
    part, whole = loss_weight(local), max(loss_weight(batch), 1)  # rows, or a mask's Trues
    hook = functools.partial(allreduce_gradients, local_rows=part, global_rows=whole, group=group)
    sharded = getattr(model, "sharded", None)  # LSQ: the global batch's gradient factor
    lsq = sharded(n_local, rows) if group.distributed and sharded else contextlib.nullcontext()
    with lsq, global_masks(model, (rows, sl.start, sl.stop) if group.distributed else None):
        loss, total = run(model, local, optimizer, max_norm=max_norm, grad_hook=hook)
    if group.distributed:
        lb = np.array([loss * part / whole if part else 0.0])
        loss = float(group.allreduce_sum(lb)[0])
    return loss, total


def calibrate(
    qat: Any, batches: Iterable[Sequence], group: ProcessGroup, *, quantizers: Any = None
) -> int:
    """Distributed calibration: each rank forwards its slice of every global batch through
    observers kept in sync, so every rank ends with the qparams of one process fed it all (the
    statistics merge exactly; the qparams equal one process's wherever a slice's activations
    are the same bits as those rows of the whole batch: docs/distributed.md).

    Parameters
    ----------
    qat : QATTemporalFusionTransformer (or a model with ``fake_quants`` and ``calibrate``)
        Its quantizers are attached to ``group`` (:func:`sync_observers`), then its
        ``calibrate`` runs over this rank's slices (:func:`shard`).
    batches : iterable of (static, historical, future, ...)
        The GLOBAL batches, identical on every rank (extra items, a target, are ignored); for
        a model that is no forecaster (``qat.num_inputs`` None) every item is an input, and an
        array is one batch of its single input, as ``qat.calibrate`` takes them.
    group : ProcessGroup
    quantizers : mapping or iterable, optional
        The quantizers to sync (default all of ``qat.fake_quants``; the activation ones
        suffice: a weight quantizer sees the same weights on every rank).

    Returns
    -------
    int
        The number of global batches used (``qat.calibrate``'s, <= its calibration_batches).

    Raises
    ------
    ValueError
        A global batch of fewer rows than processes (a rank would get an empty slice), or
        ranks holding other batches, more or fewer of them, or other weights: raised on every
        rank at once, before that batch's collectives.
    TypeError
        ``group`` not a ProcessGroup or ``qat`` not a QAT model (before anything is attached).
    """
    if not (isinstance(group, ProcessGroup) and callable(getattr(qat, "calibrate", None))):
        who = f"group {type(group).__name__}, qat {type(qat).__name__}"
        raise TypeError(f"calibrate: group must be a ProcessGroup, qat a QAT model; got {who}")
    from nbqat._dist_agree import check_ranks_agree

    sync_observers(qat.fake_quants if quantizers is None else quantizers, group)
    n_in = getattr(qat, "num_inputs", 3)  # None: a generic model, every item is an input

    def local() -> Iterable[tuple]:
        for b in batches:
            b = (b,) if isinstance(b, np.ndarray) and n_in is None else b  # one input's batch
            check_ranks_agree(qat, b[:n_in], group, "calibrate")
            sl = shard(int(np.shape(b[0])[0]), group)
            yield tuple(a[sl] for a in b[:n_in])
        check_ranks_agree(qat, (), group, "calibrate")  # no more batches: so say all ranks

    return int(qat.calibrate(local()))
