"""Draw the documentation's figures with nbqat's own public functions.

Run from the repository root (re-runnable; overwrites the PNGs)::

    python docs/make_figures.py

Writes into ``docs/figures/``:

* ``fake_quant_staircase.png``: :func:`nbqat.fake_quantize_per_tensor_affine_cachemask` on a
  dense grid of inputs (the staircase and its STE mask) and the STE gradient from
  :func:`nbqat.fake_quantize_backward`;
* ``calibration_histogram.png``: a stream of activation batches observed by
  :class:`nbqat.MinMaxObserver` and :class:`nbqat.MovingAverageMinMaxObserver`, with the range
  implied by each observer's ``calculate_qparams()``;
* ``calibration_observers.png``: the same stream through every activation observer
  (min/max, moving average, histogram L2, percentile, MSE): ranges and SQNR;
* ``clip_coefficient.png``: the factor :func:`nbqat.clip_grad_norm_` applies, measured by
  clipping gradients of increasing norm;
* ``per_channel_weights.png``: per-channel symmetric qint8 quantization of a weight matrix
  (:class:`nbqat.PerChannelMinMaxObserver`, :func:`nbqat.fake_quantize_per_channel_affine`)
  compared with one per-tensor scale.

With ``--from-run DIR`` it also copies the plots of a finished ``nbqat train`` run (its
``--out`` folder) into ``docs/figures/train/`` for the tutorial::

    nbqat train --quick --out /tmp/quick && python docs/make_figures.py --from-run /tmp/quick

Only NumPy, matplotlib and nbqat are used (no PyTorch); the data are drawn from fixed seeds, so
the figures are the same on every run.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

try:
    import nbqat
except ImportError:  # run from a checkout without `pip install -e .`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    import nbqat

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

FIGURES = Path(__file__).resolve().parent / "figures"
#: PNG metadata without the matplotlib version, so re-running does not change the bytes needlessly.
PNG_METADATA = {"Software": None}


def _save(fig: plt.Figure, out_dir: Path, name: str) -> Path:
    path = out_dir / name
    fig.savefig(path, dpi=110, bbox_inches="tight", metadata=PNG_METADATA)
    plt.close(fig)
    return path


def staircase(out_dir: Path) -> Path:
    """Fake-quant staircase, its STE mask and the STE gradient."""
    scale, zero_point, qmin, qmax = 0.25, 2, 0, 15
    x = np.linspace(-1.5, 4.5, 2401, dtype=np.float32)
    y, mask = nbqat.fake_quantize_per_tensor_affine_cachemask(x, scale, zero_point, qmin, qmax)
    grad_x = nbqat.fake_quantize_backward(np.ones_like(x), mask)

    lo = (qmin - zero_point) * scale
    hi = (qmax - zero_point) * scale
    fig, (ax0, ax1) = plt.subplots(
        2, 1, figsize=(7.0, 5.2), sharex=True, gridspec_kw={"height_ratios": [3, 1]}
    )
    ax0.plot(x, x, color="0.6", lw=1, ls="--", label="identity (float)")
    ax0.plot(x, y, color="C0", lw=1.8, label="y (fake-quantized)")
    inside = np.asarray(mask, dtype=bool)
    ax0.fill_between(
        x,
        -1.6,
        4.6,
        where=inside,
        color="C2",
        alpha=0.12,
        step="mid",
        label="mask = True (STE passes)",
    )
    ax0.set_ylim(-1.6, 4.6)
    ax0.set_ylabel("y")
    ax0.set_title(
        f"scale={scale}, zero_point={zero_point}, range [{qmin}, {qmax}]: "
        f"grid [{lo:g}, {hi:g}] in steps of {scale}"
    )
    ax0.legend(loc="upper left", fontsize=8)
    ax0.grid(alpha=0.3)

    ax1.plot(x, grad_x, color="C3", lw=1.8, drawstyle="steps-mid")
    ax1.set_ylim(-0.2, 1.2)
    ax1.set_yticks([0, 1])
    ax1.set_xlabel("x")
    ax1.set_ylabel("dL/dx  (dL/dy = 1)")
    ax1.set_title("fake_quantize_backward: STE gradient", fontsize=9)
    ax1.grid(alpha=0.3)
    fig.tight_layout()
    return _save(fig, out_dir, "fake_quant_staircase.png")


def calibration_histogram(out_dir: Path) -> Path:
    """Observers on a stream of activation batches, and the ranges they settle on."""
    rng = np.random.default_rng(7)
    batches = []
    for i in range(40):
        # post-GELU-like activations: mostly small positive values with a negative tail
        b = rng.normal(0.8, 0.9, size=4096).astype(np.float32)
        b = np.where(b > 0, b, 0.1 * b).astype(np.float32)
        if i == 25:  # one outlier batch
            b[:8] = np.float32(9.0)
        batches.append(b)

    observers = {
        "MinMaxObserver": nbqat.MinMaxObserver(),
        "MovingAverageMinMaxObserver": nbqat.MovingAverageMinMaxObserver(),
    }
    for b in batches:
        for obs in observers.values():
            obs(b)

    data = np.concatenate(batches)
    fig, ax = plt.subplots(figsize=(7.0, 4.0))
    ax.hist(data, bins=200, color="0.7", log=True, label="all calibration data")
    styles = {"MinMaxObserver": ("C3", "--"), "MovingAverageMinMaxObserver": ("C0", "-")}
    for name, obs in observers.items():
        scale, zero_point = obs.calculate_qparams()
        s = float(np.asarray(scale).reshape(-1)[0])
        z = int(np.asarray(zero_point).reshape(-1)[0])
        lo, hi = (0 - z) * s, (255 - z) * s
        color, ls = styles[name]
        label = f"{name}: [{lo:.3f}, {hi:.3f}]  (scale={s:.4g}, zero_point={z})"
        ax.axvline(lo, color=color, ls=ls, lw=1.6, label=label)
        ax.axvline(hi, color=color, ls=ls, lw=1.6)
    ax.set_xlabel("activation value")
    ax.set_ylabel("count (log)")
    ax.set_title("Calibration: quint8 range chosen by each observer after 40 batches")
    ax.legend(fontsize=7.5, loc="upper right")
    fig.tight_layout()
    return _save(fig, out_dir, "calibration_histogram.png")


def calibration_observers(out_dir: Path) -> Path:
    """The stream of :func:`calibration_histogram` through every activation observer: the
    quint8 range each one chooses and the SQNR of the fake-quantized data with it."""
    rng = np.random.default_rng(7)
    batches = []
    for i in range(40):
        b = rng.normal(0.8, 0.9, size=4096).astype(np.float32)
        b = np.where(b > 0, b, 0.1 * b).astype(np.float32)
        if i == 25:
            b[:8] = np.float32(9.0)
        batches.append(b)
    observers = {
        "MinMax": nbqat.MinMaxObserver(),
        "MovingAverageMinMax": nbqat.MovingAverageMinMaxObserver(),
        "Histogram (L2)": nbqat.HistogramObserver(),
        "Percentile 99.99": nbqat.PercentileObserver(percentile=99.99),
        "MSE": nbqat.MSEObserver(),
    }
    for b in batches:
        for obs in observers.values():
            obs(b)
    data = np.concatenate(batches)
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(10.5, 4.0), width_ratios=[2, 1])
    ax.hist(data, bins=200, color="0.7", log=True)
    sqnr = {}
    for i, (name, obs) in enumerate(observers.items()):
        s, z = (float(np.asarray(v).reshape(-1)[0]) for v in obs.calculate_qparams())
        y = nbqat.fake_quantize_per_tensor_affine(data, s, int(z), 0, 255)
        noise = np.sum((y.astype(np.float64) - data) ** 2)
        sqnr[name] = 10 * np.log10(np.sum(data.astype(np.float64) ** 2) / noise)
        lo, hi = (0 - z) * s, (255 - z) * s
        ax.axvline(hi, color=f"C{i}", lw=1.4, label=f"{name}: [{lo:.2f}, {hi:.2f}]")
        ax.axvline(lo, color=f"C{i}", lw=1.4)
        print(f"{name}: [{lo:.4f}, {hi:.4f}] scale {s:.5g} zp {int(z)} SQNR {sqnr[name]:.2f} dB")
    ax.set_xlabel("activation value")
    ax.set_ylabel("count (log)")
    ax.set_title("quint8 range chosen by each observer (40 batches)")
    ax.legend(fontsize=7, loc="upper right")
    names = list(sqnr)
    bx.barh(range(len(names)), [sqnr[n] for n in names], color=[f"C{i}" for i in range(len(names))])
    bx.set_yticks(range(len(names)), names, fontsize=8)
    bx.invert_yaxis()
    bx.set_xlabel("SQNR of the fake-quantized data (dB)")
    fig.tight_layout()
    return _save(fig, out_dir, "calibration_observers.png")


def clip_coefficient(out_dir: Path) -> Path:
    """The factor clip_grad_norm_ applies, measured on gradients of increasing norm."""
    max_norm = 1.0
    rng = np.random.default_rng(3)
    direction = [
        rng.standard_normal((16, 16)).astype(np.float32),
        rng.standard_normal(16).astype(np.float32),
    ]
    unit = float(np.sqrt(sum(float(np.sum(d.astype(np.float64) ** 2)) for d in direction)))
    norms = np.logspace(-2, 2, 81)
    coefs = []
    totals = []
    for n in norms:
        grads = [(d * np.float32(n / unit)).astype(np.float32) for d in direction]
        before = [g.copy() for g in grads]
        total = nbqat.clip_grad_norm_(grads, max_norm)
        totals.append(float(total))
        coefs.append(float(np.linalg.norm(grads[0]) / np.linalg.norm(before[0])))
    totals_a = np.asarray(totals)
    fig, ax = plt.subplots(figsize=(7.0, 3.6))
    ax.semilogx(totals_a, coefs, "o", ms=3, color="C0", label="measured: |g after| / |g before|")
    ax.semilogx(
        totals_a,
        np.minimum(max_norm / (totals_a + 1e-6), 1.0),
        color="C1",
        lw=1,
        label="min(max_norm / (total + 1e-6), 1)",
    )
    ax.axvline(max_norm, color="0.5", ls=":", lw=1)
    ax.set_xlabel("total gradient norm (returned by clip_grad_norm_)")
    ax.set_ylabel("clip coefficient")
    ax.set_title(f"clip_grad_norm_(grads, max_norm={max_norm})")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3, which="both")
    fig.tight_layout()
    return _save(fig, out_dir, "clip_coefficient.png")


def per_channel_weights(out_dir: Path) -> Path:
    """Per-channel vs per-tensor symmetric qint8 on a weight matrix with uneven rows."""
    rng = np.random.default_rng(11)
    out_features, in_features = 16, 64
    row_scale = np.geomspace(0.02, 2.0, out_features).astype(np.float32)
    w = (rng.standard_normal((out_features, in_features)) * row_scale[:, None]).astype(np.float32)

    pc = nbqat.PerChannelMinMaxObserver(ch_axis=0, dtype="qint8", qscheme="per_channel_symmetric")
    pc(w)
    s_c, z_c = pc.calculate_qparams()
    w_pc = nbqat.fake_quantize_per_channel_affine(w, s_c, z_c, 0, -128, 127)

    pt = nbqat.MinMaxObserver(dtype="qint8", qscheme="per_tensor_symmetric")
    pt(w)
    s_t, z_t = pt.calculate_qparams()
    w_pt = nbqat.fake_quantize_per_tensor_affine(w, s_t, z_t, -128, 127)

    def rel_err(wq: np.ndarray) -> np.ndarray:
        num = np.linalg.norm((np.asarray(wq) - w).astype(np.float64), axis=1)
        return num / np.linalg.norm(w.astype(np.float64), axis=1)

    rows = np.arange(out_features)
    fig, ax = plt.subplots(figsize=(7.0, 3.6))
    ax.semilogy(rows, rel_err(w_pt), "s-", color="C3", ms=4, label="per-tensor scale")
    ax.semilogy(rows, rel_err(w_pc), "o-", color="C0", ms=4, label="per-channel scales")
    ax.set_xlabel("output channel (row), weights' magnitude grows to the right")
    ax.set_ylabel("relative error of the row")
    ax.set_title("Symmetric qint8 weights: one scale per row vs one for the matrix")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3, which="both")
    fig.tight_layout()
    return _save(fig, out_dir, "per_channel_weights.png")


FIGURE_FUNCTIONS = (
    staircase,
    calibration_histogram,
    calibration_observers,
    clip_coefficient,
    per_channel_weights,
)

#: Plots of ``nbqat train`` that the tutorial shows (copied by ``--from-run``).
TRAIN_PLOTS = (
    "loss_curves.png",
    "forecast_float.png",
    "forecast_int8.png",
    "variable_importance.png",
    "attention.png",
    "clipping_comparison.png",
)


def copy_run_plots(run_dir: Path, out_dir: Path) -> list[Path]:
    """Copy the PNG plots of a finished ``nbqat train --out RUN_DIR`` into ``out_dir/train``.

    Plots the run did not make (``clipping_comparison.png`` needs ``--compare-clipping``) are
    skipped; the run's ``summary.txt`` is printed so that the tutorial's table can be updated.
    """
    if not (run_dir / "metrics.json").is_file():
        raise SystemExit(f"{run_dir} is not a finished nbqat train run (no metrics.json)")
    dest = out_dir / "train"
    dest.mkdir(parents=True, exist_ok=True)
    copied = []
    for name in TRAIN_PLOTS:
        src = run_dir / name
        if src.is_file():
            shutil.copyfile(src, dest / name)
            copied.append(dest / name)
    summary = run_dir / "summary.txt"
    if summary.is_file():
        print(summary.read_text())
    return copied


def main(argv: list[str] | None = None) -> int:
    """Draw every figure into ``--out`` (default ``docs/figures``) and print the paths."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=FIGURES, help="output folder")
    parser.add_argument(
        "--from-run",
        type=Path,
        default=None,
        metavar="DIR",
        help="also copy the plots of a finished `nbqat train --out DIR` run into OUT/train",
    )
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    for fn in FIGURE_FUNCTIONS:
        print(fn(args.out))
    if args.from_run is not None:
        for path in copy_run_plots(args.from_run, args.out):
            print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
