"""Peer check: statsforecast's AutoETS on nbqat's test origins of a held-out set.

A benchmark-only comparator (never a dependency of nbqat): statsforecast lives in a separate
virtual environment with nbqat's data dependencies::

    python -m venv /work/venv-sf && /work/venv-sf/bin/pip install statsforecast pyarrow \\
        tqdm matplotlib threadpoolctl
    PYTHONPATH=. /work/venv-sf/bin/python benchmarks/peer_autoets.py taylor \\
        --wheels /tmp/heldout-wheels --out /tmp/heldout

The windows are exactly ``nbqat train``'s for the set (``benchmarks/heldout.py``'s columns,
horizon, history and calendar; the job's split and eval stride). Per series, AutoETS (its
documented defaults; ``season_length`` the data's period: SEASON) is fitted once on the rows
before the series' test split, then for every test origin applied to all of that series'
rows before the origin (``forward``: the fitted model, re-filtered; no test target of the
window in any input) for the horizon. P50 is its point forecast, P10 / P90 the bounds of its
80 % interval. Prints a JSON line with the q-risk and the wall time.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

#: AutoETS's season_length per set: the data's main period (daily: a week; hourly: a day;
#: half-hourly: a day; monthly: a year; weekly: a year).
SEASON = {"seattle_weather": 7, "taylor": 48, "miami_ghi": 24, "us_employment": 12, "co2": 52}


def job_windows(args: list[str]):
    """The windows ``nbqat train ARGS`` builds (resolved config, the job's ``load_data``)."""
    from nbqat.train.config import TrainConfig
    from nbqat.train.model import load_data
    from nbqat.train.parser import build_parser

    ns = build_parser().parse_args(["train", *args])
    return load_data(TrainConfig.from_args(ns).resolved())


def forecast(w, season: int) -> np.ndarray:
    """float64 (B, tau, 3): AutoETS's P10 / P50 / P90 at each test window of ``w``."""
    from statsforecast.models import AutoETS

    t = w.test
    first = w.split_bounds["train"][:, 0]
    test_lo = w.split_bounds["test"][:, 0]
    y = np.asarray(w.target_raw, dtype=np.float64)
    out = np.empty((len(t), w.horizon, 3))
    for e in np.unique(t.entity):
        model = AutoETS(season_length=season).fit(y[first[e] : test_lo[e]])
        for i in np.flatnonzero(t.entity == e):
            fc = model.forward(y=y[first[e] : t.rows[i]], h=w.horizon, level=[80])
            out[i] = np.stack([fc["lo-80"], fc["mean"], fc["hi-80"]], axis=-1)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("name", help="a set of benchmarks/heldout.py")
    ap.add_argument("--wheels", type=Path)
    ap.add_argument("--out", type=Path, default=Path("heldout"))
    a = ap.parse_args()
    import statsforecast
    from heldout import convert

    from nbqat.train import QUANTILES, q_risk

    _, args = convert(a.name, a.out, a.wheels)
    w = job_windows(args)
    t0, c0 = time.perf_counter(), time.process_time()
    pred = forecast(w, SEASON[a.name])
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    qr = q_risk(pred, w.test.target_raw(), QUANTILES)
    print(json.dumps({
        "set": a.name, "model": f"statsforecast {statsforecast.__version__} AutoETS",
        "season_length": SEASON[a.name], "windows_test": len(w.test),
        "q_risk_test": {k: float(v) for k, v in qr.items()},
        "wall_s": round(wall, 1), "cpu_s": round(cpu, 1),
    }))  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
