"""Loading a long-format CSV, against a bare ``pandas.read_csv`` of the same file (issue 16).

The file: 200 series x 8,760 hourly rows (1.75 M rows, the shipped dataset's 13 columns, about
140 MB), generated once. Each load runs in a fresh Python process that imports the same
modules first, so the figures are the load's own wall time and its peak-memory increment
(``VmHWM`` after the load minus the resident size before it), each the median of
:data:`ROUNDS` loads interleaved with the others (the machine is shared: single loads vary by
tens of percent):

* ``bare_default``: ``pandas.read_csv(path)`` (the C engine, every column);
* ``bare_pyarrow``: ``pandas.read_csv(path, engine="pyarrow")``;
* ``nbqat``: :func:`nbqat.data.load_csv` with the shipped roles (all checks included).

Goals (issue 16): nbqat within 2x the time of the bare read and within 1.5x its peak memory;
the ratios are reported, never asserted. Also reported: the streaming evaluation's time per
test window at two test-split sizes (it should be constant: evaluation linear in windows).
``NBQAT_BENCH_SMALL=1``: 4 series x 600 rows.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from _roof import report
from conftest import SMALL

N_SERIES, N_HOURS = (4, 600) if SMALL else (200, 8760)
#: Loads of each kind (fresh processes, interleaved); the medians are reported.
ROUNDS = 1 if SMALL else 5
ROLES = dict(
    time_col="time",
    target_col="temp_air",
    entity_col="station",
    known_cols="etr",
    static_cols="latitude,longitude,elevation",
)


def _write_csv(path: Path) -> Path:
    import pandas as pd

    rng = np.random.default_rng(0)
    n = N_SERIES * N_HOURS
    t = pd.date_range("2001-01-01", periods=N_HOURS, freq="h").strftime("%Y-%m-%dT%H:%M")
    station = np.repeat([f"station_{i:03d}" for i in range(N_SERIES)], N_HOURS)
    per = lambda a: np.repeat(a, N_HOURS)  # noqa: E731
    df = pd.DataFrame(
        {
            "station": station,
            "time": np.tile(np.asarray(t), N_SERIES),
            "temp_air": np.round(rng.normal(10, 8, n), 1),
            "temp_dew": np.round(rng.normal(5, 6, n), 1),
            "relative_humidity": rng.integers(10, 100, n),
            "pressure": rng.integers(950, 1040, n),
            "wind_speed": np.round(rng.gamma(2, 2, n), 1),
            "total_cloud": rng.integers(0, 11, n),
            "ghi": rng.integers(0, 1000, n),
            "etr": rng.integers(0, 1400, n),
            "latitude": per(np.round(rng.uniform(25, 60, N_SERIES), 3)),
            "longitude": per(np.round(rng.uniform(-160, -70, N_SERIES), 3)),
            "elevation": per(rng.integers(0, 2000, N_SERIES)),
        }
    )
    df.to_csv(path, index=False)
    return path


_CHILD = r"""
import json, resource, sys, time
import pandas as pd
import nbqat.data as nd
def status(key):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key):
                return int(line.split()[1])
    return 0
rss = lambda: status("VmRSS:")
path, how, roles = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
before = rss()
t0 = time.perf_counter()
if how == "bare_default":
    x = pd.read_csv(path)
elif how == "bare_pyarrow":
    x = pd.read_csv(path, engine="pyarrow")
else:
    x = nd.load_csv(path, **roles)
dt = time.perf_counter() - t0
# VmHWM, not ru_maxrss: a child's ru_maxrss starts at its parent's peak (Linux keeps the
# larger of the two across fork + exec), and the parent here holds the generated table.
peak = status("VmHWM:") or resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"s": dt, "peak_mb": (peak - before) / 1024}))
"""


def _measure(path: Path, how: str) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", _CHILD, str(path), how, json.dumps(ROLES)],
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def big_csv(tmp_path_factory):
    return _write_csv(tmp_path_factory.mktemp("data") / "series.csv")


def test_load_csv_vs_bare_read_csv(benchmark, big_csv):
    hows = ("bare_default", "bare_pyarrow", "nbqat")
    runs: dict[str, list[dict]] = {how: [] for how in hows}
    for _ in range(ROUNDS):  # interleaved, so that a busy spell hits every kind of load
        for how in hows:
            runs[how].append(_measure(big_csv, how))
    m = {
        how: {k: float(np.median([r[k] for r in runs[how]])) for k in ("s", "peak_mb")}
        for how in hows
    }
    benchmark.pedantic(lambda: None, rounds=1)
    ours, bare = m["nbqat"], m["bare_default"]
    report(
        benchmark,
        rows=N_SERIES * N_HOURS,
        file_mb=big_csv.stat().st_size / 2**20,
        rounds=ROUNDS,
        nbqat_s=ours["s"],
        bare_default_s=bare["s"],
        bare_pyarrow_s=m["bare_pyarrow"]["s"],
        nbqat_peak_mb=ours["peak_mb"],
        bare_default_peak_mb=bare["peak_mb"],
        bare_pyarrow_peak_mb=m["bare_pyarrow"]["peak_mb"],
        time_ratio_vs_bare=ours["s"] / bare["s"],
        peak_ratio_vs_bare=ours["peak_mb"] / max(bare["peak_mb"], 1e-9),
    )


def test_evaluation_time_per_window_is_constant(benchmark):
    """Forward passes over the test split in batches of 256 at two split sizes."""
    from nbqat.data import load_tmy3, make_windows
    from nbqat.nn import TemporalFusionTransformer, TFTConfig

    data = load_tmy3()
    per_window = {}
    for stride in (48, 12) if not SMALL else (96, 48):
        w = make_windows(data, history=168, horizon=24, eval_stride=stride)
        cfg = TFTConfig(
            num_static_features=w.static.shape[1],
            num_known_features=w.future_features.shape[1],
            num_unknown_features=w.hist_features.shape[1],
            hidden_dim=16,
            sequence_length=w.history,
            prediction_horizon=w.horizon,
            quantiles=w.quantiles,
            num_heads=4,
        )
        model = TemporalFusionTransformer(cfg, seed=0, dtype=np.float32)
        test = w.test
        s, h, f, _ = test.batch(np.arange(min(len(test), 16)))
        model.forward(s, h, f)  # compile
        t0 = time.perf_counter()
        for i in range(0, len(test), 256):
            s, h, f, _ = test.batch(np.arange(i, min(i + 256, len(test))))
            model.forward(s, h, f)
        per_window[len(test)] = (time.perf_counter() - t0) / len(test)
    benchmark.pedantic(lambda: None, rounds=1)
    (n1, t1), (n2, t2) = sorted(per_window.items())
    report(
        benchmark,
        windows_small=n1,
        windows_large=n2,
        ms_per_window_small=t1 * 1e3,
        ms_per_window_large=t2 * 1e3,
        per_window_ratio=t2 / t1,
    )
