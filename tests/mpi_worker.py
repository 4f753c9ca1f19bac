"""Run by tests/test_distributed.py as ``mpiexec -n N python tests/mpi_worker.py MODE OUT``.

MODE ``observers``: each rank feeds its own shards to several quantizers; rank 0 saves states.
MODE ``train``: data-parallel calibration + QAT steps of a tiny TFT; rank 0 saves the losses,
norms, parameters, qparams and the int8 model's output.
MODE ``train_uneven``: the same on 7-row batches (uneven shards): FakeQuantize, LSQ with SGD and
Adam (:data:`UNEVEN_RUNS`).
MODE ``dropout``: SGD steps of a tiny TFT with dropout active through
``dist.data_parallel_step`` alone (:func:`worker_common.dropout_run`).
MODE ``masked``: Adam steps on masked 7-row batches (:func:`worker_common.masked_run`).
MODE ``float8``: sharded calibration of a float8 MLP (:func:`worker_common.float8_run`).
MODE ``threads``: ``train_uneven``'s Adam + LSQ run on the parallel kernel builds, with rank r on
1 + r Numba threads, then with every rank on 1 thread.
MODE ``channels``: a per-channel observer fed 3 channels on rank 0, 4 on rank 1 (a mismatched
model); each rank saves the ValueError's message.
MODE ``fail``: rank 1 raises; the others wait in a collective (they must not hang).
Every rank writes ``OUT/rank<r>.npz``.

MODE ``main`` (``mpi_worker.py main REC train ARGS...``): ``nbqat train ARGS`` under an audit
hook that records every file this rank creates, changes or removes below ``--out``; each rank
writes the list to ``REC/writes<r>.json`` and exits with the command's status. MODE
``main_fail``: the same, and rank 1's third training step raises.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import numpy as np

import nbqat
from nbqat import distributed as dist

#: The ``train_uneven`` runs: (name, optimizer, learnable scales).
UNEVEN_RUNS = (("fq", nbqat.SGD, False), ("sgd", nbqat.SGD, True), ("adam", nbqat.Adam, True))


def global_batches(seed, n, shape):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(shape).astype(np.float32) * (1 + i) for i in range(n)]


def quantizers():
    return {
        "ma": nbqat.MovingAverageMinMaxObserver(),
        "mm": nbqat.MinMaxObserver(dtype="qint8", qscheme="per_tensor_symmetric"),
        "pc": nbqat.MovingAveragePerChannelMinMaxObserver(ch_axis=1),
        "fq": nbqat.FakeQuantize(quant_min=0, quant_max=255),
        "lsq": nbqat.LearnableFakeQuantize(quant_min=0, quant_max=255),
        "nan": nbqat.MinMaxObserver(nonfinite="ignore"),
        "hist": nbqat.HistogramObserver(bins=64),
        "pct": nbqat.PercentileObserver(percentile=99.0),
        "mse": nbqat.MSEObserver(qscheme="per_channel_affine", ch_axis=1, mantissa_bits=3),
        # past max_exact after two batches: the fine grid, built in the shards' rank order
        "mse_grid": nbqat.MSEObserver(qscheme="per_channel_affine", ch_axis=1, max_exact=10),
        "mse_grid_t": nbqat.MSEObserver(max_exact=20, nonfinite="ignore"),
    }


def observer_batches():
    """Global batches (7, 4); row 0 holds a NaN (only the "ignore" observer sees it)."""
    out = []
    for b in global_batches(3, 5, (7, 4)):
        b[0, 0] = np.nan
        out.append(b)
    return out


def local_input(name, b, group):
    """What quantizer ``name`` sees on this rank: its shard (rank 0's without the NaN row, so
    that the shards differ in size), or nothing at all on step 2 for rank 1 (an empty batch)."""
    local = b[dist.shard(len(b), group)]
    if name != "nan" and group.rank == 0:
        local = local[1:]
    return local


def run_observers(group):
    qs = quantizers()
    dist.sync_observers(qs, group)
    out = {}
    for i, b in enumerate(observer_batches()):
        for name, q in qs.items():
            x = local_input(name, b, group)
            q(x[:0] if (i == 2 and group.rank == group.size - 1) else x)
    for name, q in qs.items():
        for k, v in q.state_dict().items():
            out[f"{name}.{k}"] = np.asarray(v)
    return out


def run_train(group, steps=4):
    from worker_common import tiny_run  # tests/worker_common.py

    return tiny_run(group, steps)


_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
_CHANGES = ("os.rename", "os.mkdir", "os.remove", "os.rmdir", "shutil.rmtree", "shutil.copyfile")


def record_writes(below: Path, seen: list) -> None:
    """Append ``(event, path)`` to ``seen`` for each write below the folder ``below``."""
    root = str(below.resolve())

    def inside(p) -> bool:
        return isinstance(p, (str, bytes, os.PathLike)) and os.path.abspath(
            os.fsdecode(p)
        ).startswith(root)

    def hook(event, args):
        if event == "open":
            path, mode, flags = args
            writes = any(c in mode for c in "wax+") if isinstance(mode, str) else None
            if writes is None:
                writes = bool(flags & _WRITE_FLAGS)
            if writes and inside(path):
                seen.append((event, os.fsdecode(path)))
        elif event in _CHANGES:
            paths = [a for a in args[:2] if inside(a)]
            if paths:
                seen.append((event, os.fsdecode(paths[-1])))

    sys.addaudithook(hook)


def run_main(mode, rec, argv, group):
    """``nbqat train`` under the write recorder (and, for ``main_fail``, rank 1 failing)."""
    from nbqat import cli
    from nbqat.nn import step

    out = Path(argv[argv.index("--out") + 1]) if "--out" in argv else None
    if out is None:  # --resume CKPT: the run folder is the checkpoint's parent
        out = Path(argv[argv.index("--resume") + 1]).parent
    if mode == "main_fail" and group.rank == 1:
        real, calls = step.train_step, []

        def failing(*a, **k):
            calls.append(1)
            if len(calls) == 3:
                raise RuntimeError("deliberate failure in a training step")
            return real(*a, **k)

        step.train_step = failing
    seen: list = []
    record_writes(out, seen)
    try:
        rc = cli.main(argv)
    finally:
        Path(rec, f"writes{group.rank}.json").write_text(json.dumps(seen))
    sys.exit(rc)


def main():
    mode, out = sys.argv[1], sys.argv[2]
    group = dist.init_process_group()
    if mode in ("main", "main_fail"):
        return run_main(mode, out, sys.argv[3:], group)
    dist.install_abort_handler(group)
    if mode == "observers":
        res = run_observers(group)
    elif mode == "train":
        res = run_train(group)
    elif mode == "train_uneven":  # 7-row batches (4 + 3 rows): FakeQuantize; LSQ, SGD and Adam
        from worker_common import tiny_run

        res = {}
        for name, opt, lsq in UNEVEN_RUNS:
            run = tiny_run(group, 3, opt, rows=7, learnable=lsq)
            res.update({f"{name}.{k}": v for k, v in run.items()})
    elif mode == "masked":  # a target mask keeping uneven counts per rank
        from worker_common import masked_run

        res = masked_run(group)
    elif mode == "dropout":  # the public data_parallel_step on a TFT with dropout active
        from worker_common import dropout_run

        res = dropout_run(group)
    elif mode == "float8":  # float8 activations (dynamic per-tensor scales), calibrated
        from worker_common import float8_run

        res = float8_run(group)
    elif mode == "threads":  # results must not depend on each rank's thread count
        import numba
        from worker_common import tiny_run

        from nbqat import _jit

        _jit.PARALLEL_MIN, res = 0, {}  # every kernel on its parallel build
        for name, threads in (("mixed", 1 + group.rank), ("one", 1)):
            numba.set_num_threads(threads)
            run = tiny_run(group, 3, nbqat.Adam, rows=7, learnable=True)
            res.update({f"{name}.{k}": v for k, v in run.items()})
    elif mode == "channels":
        obs = nbqat.PerChannelMinMaxObserver(ch_axis=1)
        dist.sync_observers([obs], group)
        try:
            obs(np.ones((5, 3 + group.rank), np.float32))
            res = {"error": np.array("")}
        except ValueError as e:
            res = {"error": np.array(str(e))}
    elif mode == "fail":
        if group.rank == 1:
            raise RuntimeError("deliberate failure")
        group.barrier()  # rank 1 never arrives
        res = {}
    else:
        raise SystemExit(f"unknown mode {mode}")
    res["size"] = np.array(group.size)
    np.savez(f"{out}/rank{group.rank}.npz", **res)


if __name__ == "__main__":
    main()
