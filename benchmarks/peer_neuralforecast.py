"""Peer check: neuralforecast's NHITS, TiDE and PatchTST on nbqat's split and test origins.

A benchmark-only comparator (never a dependency of nbqat): neuralforecast lives in a separate
virtual environment with nbqat's runtime dependencies::

    python -m venv /work/venv-nf && /work/venv-nf/bin/pip install torch==2.13.0 neuralforecast \\
        pyarrow tqdm matplotlib threadpoolctl numba scipy onnx onnxruntime
    OMP_NUM_THREADS=1 PYTHONPATH=. nice -n 19 /work/venv-nf/bin/python \\
        benchmarks/peer_neuralforecast.py --model NHITS --seed 0            # the shipped data
    ... benchmarks/peer_neuralforecast.py taylor --model TiDE --wheels /tmp/heldout-wheels \\
        --out /tmp/heldout-nf                                                # a held-out set

The windows are exactly ``nbqat train``'s (``benchmarks/peer_autoets.py``'s ``job_windows``:
the shipped data with the default options, or a set of ``benchmarks/heldout.py`` with its
columns, horizon, history and calendar; the job's split and eval stride). Every series becomes
a neuralforecast series on an integer clock (``ds`` = the row in its entity, ``freq=1``) with
nbqat's standardised target (per-entity level and scale of the training rows, as the TFT and
the pytorch-forecasting peer see it; the forecasts are unscaled with the same level and
scale), the job's known inputs (calendar and ``--known-cols``, standardised) as
``futr_exog_list`` and its observed inputs as ``hist_exog_list`` where the model takes them
(NHITS, TiDE; PatchTST takes none).

Each model keeps neuralforecast's documented defaults except ``h`` = the job's horizon,
``input_size`` = its history, ``loss`` = ``MQLoss(level=[80])`` (P10 / P50 / P90),
``random_seed`` = ``--seed`` and early stopping: it is fitted on the rows before the test split
only, the last ``val_size`` rows of which (the job's validation split) are its validation
windows, checked every ``val_check_steps`` (default 100) and stopped after
``--patience`` (5) checks without improvement. The test forecasts are one batched pass
(``cross_validation(use_fitted=True, test_size, step_size=eval_stride)``, the fitted model
unchanged) at exactly nbqat's test origins; each window's input is its ``input_size`` rows
before the origin (neuralforecast masks the forecast steps' targets; the known inputs of the
forecast steps are given, as nbqat gives them). ``--check`` also forecasts the first and last
origin with ``NeuralForecast.predict`` on the series cut at the origin (no row at or after it
but the known inputs) and reports the largest difference. The q-risk is the job's
(``nbqat.train.q_risk`` on the unscaled test targets); the seasonal naive is scored the same
way as a check against ``metrics.json``. Prints a JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

MODELS = ("NHITS", "TiDE", "PatchTST")


def frame(w):
    """The long frame of ``w``'s rows (``unique_id``, ``ds``, ``y``, exogenous columns) and
    the (futr, hist) exogenous column names."""
    import pandas as pd

    futr = [f"k{j}" for j in range(len(w.future_names))]
    obs = [n for n in w.historical_names[1:] if n not in w.future_names]
    hcols = [w.historical_names.index(n) for n in obs]
    hist = [f"o{j}" for j in range(len(obs))]
    first = w.split_bounds["train"][:, 0]
    end = w.split_bounds["test"][:, 1]
    parts = []
    for e in range(len(first)):
        rows = np.arange(first[e], end[e])
        d = {"unique_id": str(e), "ds": np.arange(len(rows)), "y": w.target_std[rows]}
        d.update({c: w.future_features[rows, j] for j, c in enumerate(futr)})
        d.update({c: w.hist_features[rows, j] for c, j in zip(hist, hcols)})
        parts.append(pd.DataFrame(d))
    df = pd.concat(parts, ignore_index=True)
    df["y"] = df["y"].astype(np.float64)
    return df, futr, hist


def make_model(name: str, w, futr, hist, seed: int, patience: int, max_steps: int | None):
    """``name`` with its defaults but the horizon, history, loss, seed and early stopping."""
    import neuralforecast.models as nfm
    from neuralforecast.losses.pytorch import MQLoss

    cls = getattr(nfm, name)
    kw: dict = dict(h=w.horizon, input_size=w.history, loss=MQLoss(level=[80]),
                    random_seed=seed, early_stop_patience_steps=patience)  # fmt: skip
    if cls.EXOGENOUS_FUTR:
        kw["futr_exog_list"] = futr
    if cls.EXOGENOUS_HIST and hist:
        kw["hist_exog_list"] = hist
    if max_steps is not None:
        kw["max_steps"] = max_steps
    trainer = dict(accelerator="cpu", devices=1, logger=False, enable_progress_bar=False,
                   enable_model_summary=False, enable_checkpointing=False)  # fmt: skip
    return cls(**kw, **trainer)


def rows_before(df, w, stop: np.ndarray):
    """The rows of ``df`` before the global row ``stop[e]`` of each entity ``e``."""
    lim = (stop - w.split_bounds["train"][:, 0])[df["unique_id"].astype(int).to_numpy()]
    return df[df["ds"].to_numpy() < lim]


def _columns(alias: str) -> list[str]:
    return [f"{alias}-lo-80", f"{alias}-median", f"{alias}-hi-80"]


def _test_sizes(w) -> tuple[int, int]:
    """(val_size, test_size): one length for every entity (neuralforecast's), the test part
    ending with the last test window."""
    val = w.split_bounds["val"][:, 1] - w.split_bounds["val"][:, 0]
    t = w.test
    last = np.array([t.rows[t.entity == e].max() for e in range(len(val))])
    test = last + w.horizon - w.split_bounds["test"][:, 0]
    if len(set(val.tolist())) != 1 or len(set(test.tolist())) != 1:
        raise SystemExit(f"entities differ in split lengths (val {val}, test {test})")
    return int(val[0]), int(test[0])


def forecast(nf, df, w, alias: str) -> np.ndarray:
    """float64 (n_test, tau, 3), standardised: the fitted model at nbqat's test origins."""
    _, test_size = _test_sizes(w)
    first = w.split_bounds["train"][:, 0]
    cv = nf.cross_validation(df=rows_before(df, w, w.split_bounds["test"][:, 0] + test_size),
                             use_fitted=True, n_windows=None,
                             test_size=test_size, step_size=w.eval_stride)  # fmt: skip
    cv = cv.sort_values(["unique_id", "cutoff", "ds"])
    ent = cv["unique_id"].astype(int).to_numpy()
    origin = cv["cutoff"].to_numpy().astype(np.int64) + 1 + first[ent]  # global row
    vals = cv[_columns(alias)].to_numpy(np.float64)
    by_origin = {}
    for o in np.unique(origin):
        sel = origin == o
        by_origin[int(o)] = vals[sel][np.argsort(cv["ds"].to_numpy()[sel])]
    missing = [int(r) for r in w.test.rows if int(r) not in by_origin]
    if missing:
        raise SystemExit(f"{len(missing)} test origins not forecast, e.g. {missing[:3]}")
    return np.stack([by_origin[int(r)] for r in w.test.rows])


def check_cut(nf, df, w, alias: str, pred: np.ndarray) -> float:
    """Largest |difference| between ``pred`` and ``predict`` on the series cut at the first
    and the last test origin (only the known inputs of the forecast steps given)."""
    first = w.split_bounds["train"][:, 0]
    worst = 0.0
    for i in (0, len(w.test) - 1):
        e, r = int(w.test.entity[i]), int(w.test.rows[i])
        s = df[df["unique_id"] == str(e)]
        cut = s[s["ds"] < r - first[e]]
        fut = s[(s["ds"] >= r - first[e]) & (s["ds"] < r - first[e] + w.horizon)]
        fut = fut.drop(columns=["y", *[c for c in s.columns if c.startswith("o")]])
        p = nf.predict(df=cut, futr_df=fut if nf.models[0].futr_exog_list else None)
        worst = max(worst, float(np.max(np.abs(p[_columns(alias)].to_numpy() - pred[i]))))
    return worst


def _last_step(model) -> int:
    """The last training step logged (the step early stopping ended on)."""
    return int(model.train_trajectories[-1][0]) + 1 if model.train_trajectories else 0


def val_losses(model) -> tuple[float | None, float | None]:
    """The best and the last validation loss logged (neuralforecast keeps the last weights,
    not the best)."""
    v = [float(x) for _, x in model.valid_trajectories]
    return (min(v), v[-1]) if v else (None, None)


def _windows(a):
    from peer_autoets import job_windows

    if a.name == "shipped":
        return job_windows([])
    from heldout import convert

    return job_windows(convert(a.name, a.out, a.wheels)[1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "name",
        nargs="?",
        default="shipped",
        help="'shipped' (the default nbqat train data) or a set of heldout.py",
    )
    ap.add_argument("--model", choices=MODELS, required=True)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--patience", type=int, default=5, help="validation checks (-1: off)")
    ap.add_argument("--max-steps", type=int, help="override the model's default (a smoke run)")
    ap.add_argument("--check", action="store_true", help="compare with predict on cut series")
    ap.add_argument("--wheels", type=Path)
    ap.add_argument("--out", type=Path, default=Path("heldout"))
    a = ap.parse_args()  # fmt: skip
    import logging

    import neuralforecast
    import torch
    from neuralforecast import NeuralForecast

    from nbqat.train import QUANTILES, q_risk
    from nbqat.train.baselines import seasonal_naive_forecast

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    logging.getLogger("pytorch_lightning").setLevel(logging.ERROR)
    w = _windows(a)
    df, futr, hist = frame(w)
    val_size, _ = _test_sizes(w)
    t0, c0, load0 = time.perf_counter(), time.process_time(), os.getloadavg()[0]
    model = make_model(a.model, w, futr, hist, a.seed, a.patience, a.max_steps)
    nf = NeuralForecast(models=[model], freq=1)
    nf.fit(df=rows_before(df, w, w.split_bounds["test"][:, 0]), val_size=val_size)
    fit_wall, fit_cpu = time.perf_counter() - t0, time.process_time() - c0
    model = nf.models[0]
    pred_std = forecast(nf, df, w, a.model)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    y = w.test.target_raw()
    qr = q_risk(w.test.unscale(pred_std), y, QUANTILES)
    out = {
        "set": a.name, "model": a.model, "seed": a.seed,
        "neuralforecast": neuralforecast.__version__, "torch": torch.__version__,
        "history": w.history, "horizon": w.horizon, "val_size": val_size,
        "windows_test": len(w.test), "futr_exog": len(model.futr_exog_list),
        "hist_exog": len(model.hist_exog_list), "steps_run": _last_step(model),
        "max_steps": model.hparams.get("max_steps"),
        "parameters": sum(p.numel() for p in model.parameters()),
        "val_loss_best_last": val_losses(model),
        "q_risk_test": qr,
        "q_risk_test_seasonal_naive": q_risk(seasonal_naive_forecast(w.test)[0], y, QUANTILES),
        "fit_wall_s": round(fit_wall, 1), "fit_cpu_s": round(fit_cpu, 1),
        "wall_s": round(wall, 1), "cpu_s": round(cpu, 1), "torch_threads": torch.get_num_threads(),
        "load_avg_start_end": (load0, os.getloadavg()[0]),
    }  # fmt: skip
    if a.check:
        out["check_cut_max_abs_diff"] = check_cut(nf, df, w, a.model, pred_std)
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
