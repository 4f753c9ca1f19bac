"""Timed data-parallel QAT steps, run by bench_distributed.py as
``mpiexec -n N python benchmarks/_dist_worker.py SMALL OUT.json [GLOBAL_BATCH]``.

Rank 0 writes the median step time, the time spent in the gradient allreduce and in the
observer syncs per step, the number of observer syncs per step and the flat gradient buffer's
size in bytes. One thread per process (numba and BLAS).
"""

from __future__ import annotations

import json
import os
import sys
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("NUMBA_NUM_THREADS", "1")

import numpy as np  # noqa: E402

import nbqat  # noqa: E402
from nbqat import distributed as dist  # noqa: E402
from nbqat.nn import TemporalFusionTransformer, TFTConfig  # noqa: E402
from nbqat.nn.qat import QATTemporalFusionTransformer  # noqa: E402


def main() -> None:
    small, out = sys.argv[1] == "1", sys.argv[2]
    # the main job's model: 6 static, 4 known, 11 observed inputs, hidden 16, 4 heads
    b, k, tau, d = (8, 12, 4, 8) if small else (64, 168, 24, 16)
    if len(sys.argv) > 3:  # another global batch
        b = int(sys.argv[3])
    steps = 3 if small else 12
    cfg = TFTConfig(6, 4, 11, d, k, tau, num_heads=4)
    group = dist.init_process_group()
    dist.install_abort_handler(group)
    timers = {"allreduce": 0.0, "sync": 0.0, "syncs": 0}
    ar, ag = group.allreduce_sum, group.allgather_array

    def timed_allreduce(buf):
        t = time.perf_counter()
        r = ar(buf)
        timers["allreduce"] += time.perf_counter() - t
        return r

    def timed_allgather(obj):
        t = time.perf_counter()
        r = ag(obj)
        timers["sync"] += time.perf_counter() - t
        timers["syncs"] += 1
        return r

    group.allreduce_sum, group.allgather_array = timed_allreduce, timed_allgather  # type: ignore
    rng = np.random.default_rng(0)
    qat = QATTemporalFusionTransformer.from_float(TemporalFusionTransformer(cfg, seed=0))
    dist.sync_observers(qat.fake_quants, group)
    qat.enable_calibration()
    s = rng.standard_normal((b, 6)).astype(np.float32)
    h = rng.standard_normal((b, k, 11)).astype(np.float32)
    f = rng.standard_normal((b, tau, 4)).astype(np.float32)
    y = rng.standard_normal((b, tau)).astype(np.float32)
    sl = dist.shard(b, group)
    qat.forward(s[sl], h[sl], f[sl])
    qat.disable_calibration()
    opt = nbqat.Adam(qat.params, lr=1e-3)
    times = []
    for i in range(steps + 2):
        if i == 2:
            timers.update(allreduce=0.0, sync=0.0, syncs=0)
        group.barrier()
        t = time.perf_counter()
        dist.data_parallel_step(qat, (s, h, f, y), opt, group, max_norm=1.0)
        if i >= 2:
            times.append(time.perf_counter() - t)
    if group.rank == 0:
        res = {
            "size": group.size,
            "step_s": float(np.median(times)),
            "allreduce_s": timers["allreduce"] / steps,
            "sync_s": timers["sync"] / steps,
            "syncs_per_step": timers["syncs"] / steps,
            "grad_bytes": int(qat.grads.nbytes),
        }
        with open(out, "w") as fh:
            json.dump(res, fh)


if __name__ == "__main__":
    main()
