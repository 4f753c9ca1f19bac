"""``nbqat train --quick`` end to end on a generated electricity-sized set (issue 16).

The TFT paper's electricity set has 370 series x 26,304 hourly steps (9.7 M rows); this
benchmark generates a set of that size (columns ``meter``, ``time``, ``load``: a per-meter
level with daily and weekly cycles and noise), runs ``python -m nbqat train --quick`` on it in
a child process and reports the wall time of each phase (``timings.json``), the child's peak
resident memory and the number of test windows. Nothing is asserted.
``NBQAT_BENCH_SMALL=1``: 3 series x 800 steps.
"""

from __future__ import annotations

import json
import resource
import subprocess
import sys
import time

import numpy as np
from _roof import report
from conftest import SMALL

N_SERIES, N_STEPS = (3, 800) if SMALL else (370, 26304)


def _write(path) -> None:
    import pyarrow as pa
    import pyarrow.csv as pacsv

    rng = np.random.default_rng(0)
    h = np.arange(N_STEPS)
    t = np.datetime64("2011-01-01T00:00", "s") + h.astype("timedelta64[h]")
    times = pa.array(t.astype("datetime64[s]"))
    with pacsv.CSVWriter(path, pa.schema([("meter", pa.string()), ("time", times.type),
                                          ("load", pa.float32())])) as w:  # fmt: skip
        for e in range(N_SERIES):
            level = rng.uniform(50, 500)
            y = level * (1 + 0.3 * np.sin(2 * np.pi * h / 24) + 0.1 * np.sin(2 * np.pi * h / 168))
            y = y + rng.normal(0, 0.05 * level, N_STEPS)
            w.write_table(
                pa.table(
                    {
                        "meter": pa.array([f"MT_{e:03d}"] * N_STEPS),
                        "time": times,
                        "load": pa.array(np.round(y, 2).astype(np.float32)),
                    }
                )
            )


def test_quick_run_electricity_sized(benchmark, tmp_path):
    data = tmp_path / "electricity.csv"
    t0 = time.perf_counter()
    _write(data)
    gen_s = time.perf_counter() - t0
    out = tmp_path / "run"
    argv = [sys.executable, "-m", "nbqat", "train", "--quick", "--no-progress", "--no-plots",
            "--csv", str(data), "--time-col", "time", "--target-col", "load",
            "--entity-col", "meter", "--out", str(out)]  # fmt: skip
    if SMALL:
        argv += ["--history", "48", "--horizon", "12", "--batch-size", "16", "--epochs", "1",
                 "--windows-per-epoch", "64", "--calibration-batches", "2"]  # fmt: skip
    t0 = time.perf_counter()
    subprocess.run(argv, check=True, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    peak_mb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    benchmark.pedantic(lambda: None, rounds=1)
    phases = json.loads((out / "timings.json").read_text())["phases_s"]
    m = json.loads((out / "metrics.json").read_text())
    report(
        benchmark,
        rows=N_SERIES * N_STEPS,
        file_mb=data.stat().st_size / 2**20,
        generate_s=gen_s,
        run_wall_s=wall,
        child_peak_mb=peak_mb,
        test_windows=m["data"]["windows"]["test"],
        **{f"{k}_s": v for k, v in phases.items()},
        int8_P50=m["q_risk_test"]["int8"]["P50"],
        naive_P50=m["q_risk_test"]["seasonal_naive"]["P50"],
    )
