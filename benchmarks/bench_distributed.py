"""Data-parallel QAT over MPI on this machine: 1 process x 1 thread against 2 processes x
1 thread, the same global batch (the main job's model: hidden 16, B=64, k=168, tau=24).

Reports the step time of each, the 2-process speed-up (at the main job's batch and at 512), and
per step the time spent in the one
gradient allreduce (with the flat gradient buffer's size) and in the per-quantizer observer
syncs (their count). Each configuration runs in its own ``mpiexec`` (benchmarks/_dist_worker.py);
figures are reported, not asserted. ``NBQAT_BENCH_SMALL=1``: a tiny model and 3 steps.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

from conftest import SMALL

HERE = os.path.dirname(os.path.abspath(__file__))


def _run(n: int, out: str, batch: int | None = None) -> dict:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.dirname(HERE), *sys.path]))
    mpiexec = shutil.which("mpiexec") or "mpiexec"
    cmd = [mpiexec, "-n", str(n), sys.executable, os.path.join(HERE, "_dist_worker.py")]
    extra = [] if batch is None else [str(batch)]
    subprocess.run([*cmd, "1" if SMALL else "0", out, *extra], env=env, check=True, timeout=900)
    with open(out) as fh:
        return json.load(fh)


def test_data_parallel_qat_step(tmp_path):
    one = _run(1, str(tmp_path / "one.json"))
    two = _run(2, str(tmp_path / "two.json"))
    print(
        f"\n[distributed] QAT step, global batch fixed: 1 process {one['step_s'] * 1e3:.1f} ms, "
        f"2 processes {two['step_s'] * 1e3:.1f} ms (speed-up {one['step_s'] / two['step_s']:.2f}x)"
        f"\n[distributed] per step on 2 processes: gradient allreduce "
        f"{two['allreduce_s'] * 1e3:.2f} ms ({two['grad_bytes']} B), "
        f"{two['syncs_per_step']:.0f} observer syncs {two['sync_s'] * 1e3:.2f} ms "
        f"({100 * (two['allreduce_s'] + two['sync_s']) / two['step_s']:.0f} % of the step)"
    )
    assert one["size"] == 1 and two["size"] == 2
    big = 16 if SMALL else 512  # a larger global batch amortises the per-step fixed cost
    one_b = _run(1, str(tmp_path / "one_big.json"), big)
    two_b = _run(2, str(tmp_path / "two_big.json"), big)
    print(
        f"[distributed] global batch {big}: 1 process {one_b['step_s'] * 1e3:.1f} ms, "
        f"2 processes {two_b['step_s'] * 1e3:.1f} ms "
        f"(speed-up {one_b['step_s'] / two_b['step_s']:.2f}x; collectives "
        f"{(two_b['allreduce_s'] + two_b['sync_s']) * 1e3:.1f} ms)"
    )
