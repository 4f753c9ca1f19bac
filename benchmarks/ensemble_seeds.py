"""Issue 31's ensemble lever, measured offline: average the float quantile forecasts of finished
``nbqat train`` runs that differ only in ``--seed``.

Run as ``python benchmarks/ensemble_seeds.py RUN_DIR [RUN_DIR ...]`` (each a finished run of the
same data and options). Every run's float model (``checkpoint/float.npz``, the best validation
epoch: metrics.json's ``float`` row) forecasts through :meth:`nbqat.Forecaster.backtest` with
``engine="float"`` at the job's own origins: from ``test_start`` every ``eval_stride`` steps (the
test split; its P50 equals metrics.json's ``q_risk_test.float.P50``, checked below), and from
``val_start`` keeping the windows that end before ``test_start`` (the validation split, on which
a recipe is chosen). The ensemble is the per-row mean of the members' P10 / P50 / P90 (and, for
comparison, their median). Also reported: how often a member's quantiles cross (P10 > P50 or
P50 > P90) and the ensemble's q-risk with its quantiles sorted (the non-crossing lever). Prints
one JSON object.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd

QUANTILES = [0.1, 0.5, 0.9]
COLS = ["p10", "p50", "p90"]


def forecasts(run: Path, split: str) -> pd.DataFrame:
    """The float model's forecasts of ``split`` ("val" or "test"), sorted by entity, origin
    and step."""
    from nbqat import Forecaster

    data = json.loads((run / "metrics.json").read_text())["data"]
    start = data["test_start"] if split == "test" else data["val_start"]
    df = Forecaster.load(run).backtest(start=start, stride=data["eval_stride"], engine="float")
    if split == "val":  # the windows that end before the test split
        try:  # an integer clock (``--calendar time_index``): times are numbers
            end = float(data["test_start"])
            t = pd.to_numeric(df["time"])
        except ValueError:
            end, t = pd.Timestamp(data["test_start"]), pd.to_datetime(df["time"])
        last = t.groupby([df["entity"], df["origin"]]).transform("max")
        df = df[(last < end).to_numpy()]
    return df.sort_values(["entity", "origin", "step"]).reset_index(drop=True)


def combine(members: list[pd.DataFrame], how) -> pd.DataFrame:
    """``members[0]`` with its quantile columns replaced by ``how`` over the members."""
    out = members[0].copy()
    for c in COLS:
        out[c] = how([m[c].to_numpy() for m in members], axis=0)
    return out


def main(argv: list[str]) -> int:
    from nbqat.train.predict import q_risk_table

    runs = [Path(a) for a in argv]
    if len(runs) < 2:
        print(__doc__)
        return 2
    metrics = [json.loads((r / "metrics.json").read_text()) for r in runs]
    out: dict = {"runs": [str(r) for r in runs]}
    out["seeds"] = [m["config"]["seed"] for m in metrics]
    out["tuned_ridge_test_P50"] = metrics[0]["q_risk_test"]["ridge"]["P50"]
    out["tuned_ridge_val_P50"] = min(g["val_P50"] for g in metrics[0]["ridge_tuning"]["grid"])
    for split in ("val", "test"):
        members = [forecasts(r, split) for r in runs]
        keys = ["entity", "origin", "step"]
        if any(not m[keys].equals(members[0][keys]) for m in members):
            raise SystemExit(f"{split}: the runs forecast different windows (other data/options?)")
        p50 = [q_risk_table(m, QUANTILES)["P50"] for m in members]
        if split == "test":  # the backtest is the job's own test evaluation
            assert np.allclose(p50, [m["q_risk_test"]["float"]["P50"] for m in metrics])
        mean = combine(members, np.mean)
        srt = mean.copy()
        srt[COLS] = np.sort(mean[COLS].to_numpy(), axis=1)
        out[split] = {
            "rows": len(members[0]),
            "members_P50": p50,
            "members_mean_P50": float(np.mean(p50)),
            "ensemble_mean": q_risk_table(mean, QUANTILES),
            "ensemble_median_P50": q_risk_table(combine(members, np.median), QUANTILES)["P50"],
            "ensemble_mean_sorted_P50": q_risk_table(srt, QUANTILES)["P50"],
            "crossing_fraction": [
                float(((m["p10"] > m["p50"]) | (m["p50"] > m["p90"])).mean()) for m in members
            ],
        }
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
