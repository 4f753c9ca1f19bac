"""Peer check: pytorch-forecasting's TemporalFusionTransformer on nbqat's split and budget.

A benchmark-only comparator (never a dependency of nbqat): it needs pytorch-forecasting and
lightning, installed in a separate virtual environment that shares the oracle's torch::

    python -m venv --system-site-packages /work/venv-ptf
    /work/venv-ptf/bin/pip install pytorch-forecasting
    PYTHONPATH=. /work/venv-ptf/bin/python benchmarks/peer_pytorch_forecasting.py

The data are nbqat's own windows of the shipped dataset (``make_windows`` with the main job's
defaults): the same standardised inputs (observed, known and static reals), the same history
and horizon, training windows whose forecast starts in the training split, early stopping on
the validation windows, and the q-risk of exactly nbqat's test windows (eval stride), unscaled
with nbqat's per-station level and scale. Budget: 10 epochs of 64 batches of 64 windows
(``--epochs``, ``--batches-per-epoch``), Adam at 3e-3, gradient clipping at 1.0, patience 3
(``--patience``), hidden 16, 4 heads, dropout 0.1 -- the budget of ``nbqat train --epochs 10
--patience 3`` (the main job's default is 20 epochs, patience 5). Prints a JSON line.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np


def _frame(w, lengths):
    import pandas as pd

    hist_only = [n for n in w.historical_names[1:] if n not in w.future_names]
    hcols = [w.historical_names.index(n) for n in hist_only]
    parts, start = [], 0
    for e, n in enumerate(lengths):
        rows = np.arange(start, start + n)
        d = {"group": str(e), "time_idx": np.arange(n), "target": w.target_std[rows]}
        for j, name in zip(hcols, hist_only):
            d["obs_" + name] = w.hist_features[rows, j]
        for j, name in enumerate(w.future_names):
            d["known_" + name] = w.future_features[rows, j]
        for j, name in enumerate(w.static_names):
            d["static_" + name] = np.full(n, w.static[e, j])
        parts.append(pd.DataFrame(d))
        start += n
    return pd.concat(parts, ignore_index=True)


def _starts(split, lengths):
    """(group, time_idx of the first forecast step) of each window of a split."""
    offs = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    return [(str(e), int(r - offs[e])) for r, e in zip(split.rows, split.entity)]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--epochs", type=int, default=10)
    ap.add_argument("--batches-per-epoch", type=int, default=64)
    ap.add_argument("--patience", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    import lightning.pytorch as pl
    import torch
    from lightning.pytorch.callbacks import EarlyStopping
    from pytorch_forecasting import TemporalFusionTransformer, TimeSeriesDataSet
    from pytorch_forecasting.data.encoders import TorchNormalizer
    from pytorch_forecasting.metrics import QuantileLoss

    from nbqat.data import load_tmy3, make_windows
    from nbqat.train import QUANTILES, q_risk

    torch.set_num_threads(2)
    pl.seed_everything(a.seed, workers=True)
    data = load_tmy3()
    w = make_windows(data, history=24, horizon=24, eval_stride=6, quantiles=QUANTILES,
                     calendar=["hour", "dow"])  # fmt: skip
    lengths = data.lengths
    df = _frame(w, lengths)
    k, tau = w.history, w.horizon
    val0 = min(t for _, t in _starts(w.val, lengths))
    test0 = min(t for _, t in _starts(w.test, lengths))
    cols = list(df.columns)
    spec = dict(
        time_idx="time_idx", target="target", group_ids=["group"],
        max_encoder_length=k, min_encoder_length=k, max_prediction_length=tau,
        min_prediction_length=tau,
        static_reals=[c for c in cols if c.startswith("static_")],
        time_varying_known_reals=[c for c in cols if c.startswith("known_")],
        time_varying_unknown_reals=["target"] + [c for c in cols if c.startswith("obs_")],
        target_normalizer=TorchNormalizer(method="identity", center=False),
        add_encoder_length=False,
        scalers={c: None for c in cols if c not in ("group", "target", "time_idx")},
    )  # fmt: skip
    # a training window's forecast ends before the validation split starts
    train_ds = TimeSeriesDataSet(df[df.time_idx < val0], **spec)
    val_ds = TimeSeriesDataSet.from_dataset(
        train_ds, df[df.time_idx < test0], min_prediction_idx=val0
    )
    test_ds = TimeSeriesDataSet.from_dataset(train_ds, df, min_prediction_idx=test0)
    bs = 64
    tl = train_ds.to_dataloader(train=True, batch_size=bs, num_workers=0)
    vl = val_ds.to_dataloader(train=False, batch_size=256, num_workers=0)
    model = TemporalFusionTransformer.from_dataset(
        train_ds, hidden_size=16, attention_head_size=4, dropout=0.1, hidden_continuous_size=16,
        loss=QuantileLoss(list(QUANTILES)), learning_rate=3e-3, optimizer="adam",
        reduce_on_plateau_patience=1000, log_interval=-1,
    )  # fmt: skip
    trainer = pl.Trainer(
        max_epochs=a.epochs, limit_train_batches=a.batches_per_epoch, gradient_clip_val=1.0,
        callbacks=[EarlyStopping(monitor="val_loss", patience=a.patience, mode="min")],
        enable_checkpointing=True, logger=False, enable_progress_bar=False,
        accelerator="cpu", deterministic=True, default_root_dir="/tmp/ptf-peer",
    )  # fmt: skip
    t0, c0 = time.perf_counter(), time.process_time()
    trainer.fit(model, train_dataloaders=tl, val_dataloaders=vl)
    fit_wall, fit_cpu = time.perf_counter() - t0, time.process_time() - c0
    best = trainer.checkpoint_callback.best_model_path
    if best:
        model = TemporalFusionTransformer.load_from_checkpoint(best)
    out = model.predict(
        test_ds.to_dataloader(train=False, batch_size=256, num_workers=0),
        mode="quantiles", return_index=True, trainer_kwargs=dict(logger=False),
    )  # fmt: skip
    pred = out.output.detach().cpu().numpy().astype(np.float64)  # (n, tau, Q)
    idx = out.index
    where = {(str(g), int(t)): i for i, (g, t) in enumerate(zip(idx["group"], idx["time_idx"]))}
    pick = np.array([where[s] for s in _starts(w.test, lengths)])
    qr = q_risk(w.test.unscale(pred[pick]), w.test.target_raw(), QUANTILES)
    print(json.dumps({
        "model": "pytorch-forecasting TemporalFusionTransformer",
        "windows_test": len(pick), "epochs_run": trainer.current_epoch,
        "q_risk_test": qr, "fit_wall_s": round(fit_wall, 1), "fit_cpu_s": round(fit_cpu, 1),
        "parameters": sum(p.numel() for p in model.parameters()),
    }))  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
