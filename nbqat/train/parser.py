"""The ``nbqat`` argument parser: ``nbqat train`` and ``nbqat predict`` options and their types.

:mod:`nbqat.cli` runs what this module parses.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from typing import Any

__all__ = ["build_parser"]


def _checked(
    conv: Callable[[str], Any], ok: Callable[[Any], bool], what: str, name: str, bad: str = ""
) -> Callable[[str], Any]:
    """An argparse ``type``: ``conv(s)``, refused with "expected <what>" unless ``ok(value)``
    (``bad``: another wording for a value that parses but is out of range)."""

    def parse(s: str) -> Any:
        try:
            v = conv(s)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {what}, got {s!r}") from None
        if not ok(v):
            raise argparse.ArgumentTypeError(f"expected {bad or what}, got {s!r}")
        return v

    parse.__name__ = name
    return parse


_positive_int = _checked(int, lambda v: v >= 1, "a positive integer", "positive_int")
_history = _checked(
    lambda s: s if s == "auto" else int(s),
    lambda v: v == "auto" or v >= 1,
    "a positive integer or 'auto'",
    "history",
)
_nonneg_int = _checked(int, lambda v: v >= 0, "an integer >= 0", "nonneg_int")
_positive_float = _checked(
    float,
    lambda v: 0 < v < math.inf,
    "a positive number",
    "positive_float",
    bad="a positive finite number",
)
_nonneg_float = _checked(
    float, lambda v: math.isfinite(v) and v >= 0, "a number >= 0", "nonneg_float"
)


def _max_norm(s: str) -> float | None:
    if s.lower() in ("none", "off", "inf"):
        return None
    return _positive_float(s)


class _Parser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line (``nbqat train: error: ...``), not the
    usage block."""

    def error(self, message: str) -> Any:  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``nbqat`` command."""
    p = _Parser(
        prog="nbqat",
        description="nbqat: quantization-aware training on NumPy + Numba.",
    )
    from nbqat._version import __version__

    p.add_argument("--version", action="version", version=f"nbqat {__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    t = sub.add_parser(
        "train",
        help="train the TFT-like forecaster: float, calibration, QAT, int8, evaluation",
        description=(
            "Train the TFT-like forecaster end to end: float training (AdamW, warm-up + cosine "
            "schedule, dropout, a linear skip started at the ridge fit) with early stopping on "
            "the validation q-risk, observer calibration, QAT fine-tuning through fake "
            "quantization (STE, clip_grad_norm_), conversion to int8, and evaluation (q-risk on "
            "the test split against a seasonal-naive and a ridge baseline, and the float "
            "model fine-tuned as long as QAT and post-training quantization). Without --csv it "
            "uses the shipped dataset (NREL TMY3 hourly weather, two stations; forecast the "
            "dry-bulb temperature 24 h ahead from one day of history)."
        ),
    )
    g = _add_training(t)
    _add_model_options(g)
    _add_report_options(t, g)
    _add_lowbit_options(t)
    _add_output_options(t)
    _add_data_options(t)
    _add_predict(sub)
    return p


def _add_training(t: Any) -> Any:
    """The training group's schedule options; returns the group."""
    g = t.add_argument_group("training")
    g.add_argument(
        "--epochs",
        type=_positive_int,
        default=None,
        help="maximum float training epochs (early stopping may end sooner) "
        "[default: 20; --quick: 4]",
    )
    g.add_argument(
        "--qat-epochs",
        type=_nonneg_int,
        default=None,
        help="QAT fine-tuning epochs [default: 2; --quick: 1]",
    )
    g.add_argument("--batch-size", type=_positive_int, default=None, help="[default: 64]")
    g.add_argument(
        "--model",
        choices=("tft", "lstm"),
        default="tft",
        help="the forecaster: tft (the TFT-like network) or lstm (an LSTM encoder + MLP "
        "quantile head, nbqat.nn.LSTMForecaster; --heads, --dropout and --linear-skip are "
        "the TFT's: an error with lstm) [default: tft]",
    )
    g.add_argument(
        "--hidden-dim",
        type=_positive_int,
        default=None,
        help="hidden size d of the network [default: 16]",
    )
    g.add_argument(
        "--heads",
        type=_positive_int,
        default=None,
        help="attention heads (must divide --hidden-dim) [default: 4]",
    )
    g.add_argument(
        "--lr",
        type=_positive_float,
        default=None,
        help="AdamW learning rate of the float phase [default: 3e-3]",
    )
    g.add_argument(
        "--qat-lr",
        type=_positive_float,
        default=None,
        help="AdamW learning rate of the QAT phase [default: --lr / 10]",
    )
    g.add_argument(
        "--max-norm",
        type=_max_norm,
        default=1.0,
        help="clip_grad_norm_ threshold ('none' to disable) [default: 1.0]",
    )
    _add_early_stopping(g)
    g.add_argument(
        "--calibration-batches",
        type=_positive_int,
        default=None,
        help="observer calibration batches (QATConfig.calibration_batches) "
        "[default: 100; --quick: 10]",
    )
    g.add_argument(
        "--windows-per-epoch",
        type=_nonneg_int,
        default=None,
        help="training windows drawn per epoch (0 = all) [default: 4096; --quick: 1024]",
    )
    return g


def _add_early_stopping(g: Any) -> None:
    """--patience and --plateau-factor (the float phase's early stopping)."""
    g.add_argument(
        "--patience",
        type=_positive_int,
        default=None,
        help="early stopping: epochs without a better validation P50 q-risk [default: 5]",
    )
    g.add_argument(
        "--plateau-factor",
        type=_nonneg_float,
        default=None,
        help="at the first plateau (--patience epochs without a better validation P50), go "
        "back to the best epoch's weights and go on at this factor times the scheduled "
        "learning rate; the second plateau stops (0: stop at the first) [default: 0.1]",
    )


def _add_model_options(g: Any) -> None:
    """The training group's model, optimizer and run options."""
    g.add_argument(
        "--linear-skip",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="linear skip from the flattened window to the output, started at the ridge "
        "baseline (TFTConfig.linear_skip) [default: on]",
    )
    g.add_argument(
        "--weight-decay",
        type=_nonneg_float,
        default=None,
        help="AdamW decoupled weight decay of the network body [default: 0.3]",
    )
    g.add_argument(
        "--warmup-steps",
        type=_nonneg_int,
        default=None,
        help="linear learning-rate warm-up steps before the cosine decay [default: 100; "
        "--quick: 10]",
    )
    g.add_argument(
        "--dropout",
        type=_nonneg_float,
        default=None,
        help="dropout probability at every GLU input in training (TFTConfig.dropout) "
        "[default: 0.1]",
    )
    g.add_argument(
        "--skip-lr-scale",
        type=_positive_float,
        default=None,
        help="learning rate of the linear skip relative to --lr [default: 0.1]",
    )
    g.add_argument(
        "--ema-decay",
        type=_nonneg_float,
        default=None,
        help="exponential moving average of the float weights (decay per step; 0: off), "
        "evaluated, early-stopped and kept as the model [default: 0, off]",
    )
    g.add_argument(
        "--qat-skip-lr-scale",
        type=_positive_float,
        default=None,
        help="learning rate of the linear skip relative to --qat-lr in QAT (and in the "
        "equally fine-tuned float row) [default: 0.1]",
    )
    g.add_argument(
        "--seed",
        type=_nonneg_int,
        default=0,
        help="seed of initialisation and shuffling (an integer >= 0) [default: 0]",
    )
    g.add_argument(
        "--device",
        choices=("cpu", "cuda"),
        default="cpu",
        help="where the kernels run [default: cpu]; see the README for what runs on the device",
    )
    g.add_argument(
        "--threads",
        type=_positive_int,
        default=None,
        help="Numba threads for the compiled kernels [default: all cores]; on a busy shared "
        "machine 1 is often fastest",
    )
    g.add_argument(
        "--compare-clipping",
        action="store_true",
        help="also run QAT without clipping from the same start and seed and compare",
    )


def _add_report_options(t: Any, g: Any) -> None:
    """The quantization report group, then the training group's run controls."""
    q = t.add_argument_group("quantization report (OUT/quant_report.json)")
    q.add_argument(
        "--observer",
        choices=("minmax", "histogram", "percentile", "mse", "all"),
        default=None,
        help="activation observer [default: minmax]; 'all' also tabulates post-training "
        "q-risk for each",
    )
    q.add_argument(
        "--sensitivity", action="store_true", help="per-layer sensitivity (test q-risk, slow)"
    )
    q.add_argument(
        "--float-fallback",
        type=_nonneg_int,
        default=None,
        metavar="N",
        help="keep the N most sensitive modules in float and report the q-risk recovered",
    )
    g.add_argument(
        "--quick", action="store_true", help="a small configuration that finishes in about a minute"
    )
    g.add_argument("--no-progress", action="store_true", help="no progress bars")
    g.add_argument(
        "--stop-after-steps", type=_positive_int, default=None, help=argparse.SUPPRESS
    )  # testing: behave as if Ctrl-C came after N steps


def _add_lowbit_options(t: Any) -> None:
    """The weight format of QAT, PTQ and the integer model (issue 30)."""
    w = t.add_argument_group("weight format (default: per-channel int8)")
    w.add_argument(
        "--weight-bits", type=int, choices=(4, 8), default=None, help="[default: 8]; 4: grouped "
        "symmetric int4 weights (8-bit activations as --observer's)",
    )  # fmt: skip
    w.add_argument(
        "--group-size", type=int, default=None, metavar="G",
        help="input features per int4 weight scale (with --weight-bits 4) [default: 32]; a "
        "layer whose width is not a multiple of G is quantized per channel",
    )  # fmt: skip
    w.add_argument(
        "--weight-dtype", choices=("int", "float8_e4m3fn"), default=None,
        help="[default: int]; float8_e4m3fn: float8 weights, a scale per output channel",
    )  # fmt: skip


def _add_output_options(t: Any) -> None:
    o = t.add_argument_group("output")
    o.add_argument(
        "--out",
        default="nbqat-run",
        help="output folder (metrics.json, timings.json, checkpoint/, *.png) [default: nbqat-run]",
    )
    o.add_argument(
        "--resume",
        metavar="CHECKPOINT",
        default=None,
        help="continue an interrupted run from its checkpoint folder "
        "(OUT/checkpoint); the other options come from the checkpoint",
    )
    o.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    o.add_argument(
        "--overwrite",
        action="store_true",
        help="replace a previous run's outputs in --out (without it such an --out is refused)",
    )
    o.add_argument(
        "--check",
        action="store_true",
        help="only validate the data, the options (and a --resume checkpoint); write nothing",
    )


def _add_data_options(t: Any) -> None:
    d = t.add_argument_group("data (default: the shipped NREL TMY3 dataset)")
    d.add_argument(
        "--csv",
        "--data",
        dest="csv",
        metavar="PATH",
        default=None,
        help="your own long-format table (.csv, .csv.gz or .parquet), one row per entity and "
        "time step",
    )
    d.add_argument("--time-col", default=None, help="time column (ISO 8601 or numbers)")
    d.add_argument("--target-col", default=None, help="column to forecast")
    d.add_argument("--entity-col", default=None, help="series id column (optional)")
    d.add_argument("--known-cols", default=None, help="comma-separated inputs known in advance")
    d.add_argument("--static-cols", default=None, help="comma-separated per-entity constants")
    d.add_argument(
        "--observed-cols",
        default=None,
        help="comma-separated past-only inputs [default: all other columns]",
    )
    d.add_argument(
        "--fill-gaps",
        action="store_true",
        help="repair missing steps and values instead of failing: linear interpolation, or "
        "for a column of a few whole-number levels (a 0/1 flag, a category: at most 16 "
        "distinct values) the last value carried forward (the summary names those columns)",
    )
    d.add_argument(
        "--history",
        type=_history,
        default=None,
        help="encoder length k in steps, or 'auto': chosen on the validation split by the "
        "tuned ridge's search, history + horizon at most 240 steps (metrics.json "
        "history_choice) [default: 24, or the seasonal-naive period if longer]",
    )
    d.add_argument(
        "--horizon",
        type=_positive_int,
        default=None,
        help="forecast length tau in steps [default: 24]",
    )
    d.add_argument(
        "--calendar",
        default=None,
        help="derived known inputs, comma-separated from: hour (hour of day sin/cos), dow (day "
        "of week), doy (day of year sin/cos), time_index [default: hour,dow]",
    )
    d.add_argument(
        "--eval-stride",
        type=_positive_int,
        default=None,
        help="steps between validation/test windows [default: 6; --quick: 24]",
    )


def _add_predict(sub: Any) -> None:
    pr = sub.add_parser(
        "predict",
        help="forecast the steps after each series' last target value with a finished run",
        description=(
            "Load a finished run (model, stored scaling, column names) and forecast the "
            "--horizon steps after each series' last row with a target value. Rows after it "
            "may be in the data with the target (and observed columns) empty and the known "
            "columns filled: their known values are used; calendar features come from the "
            "timestamps. Inputs are standardised with the run's stored (training) scaling. "
            "Writes one row per entity and forecast step: entity,time,step,p10,p50,p90."
        ),
    )
    _predict_common(pr)
    pr.add_argument(
        "--at",
        metavar="TIME",
        default=None,
        help="forecast from origin TIME (its first forecast step is TIME) and add the column "
        "actual from the data",
    )
    pr.add_argument(
        "--backtest",
        action="store_true",
        help="rolling-origin forecasts with actuals (as nbqat backtest; --start, --stride)",
    )
    _backtest_options(pr)
    bt = sub.add_parser(
        "backtest",
        help="rolling-origin forecasts of a finished run with actuals, and their q-risk",
        description=(
            "Forecast from every --stride steps from --start, keep the windows whose forecast "
            "steps all have target values, write them with the column actual and print the "
            "q-risk per quantile."
        ),
    )
    _predict_common(bt)
    _backtest_options(bt)


def _predict_common(pr: Any) -> None:
    pr.add_argument("run_dir", metavar="RUN_DIR", help="the --out folder of nbqat train")
    pr.add_argument(
        "--csv",
        "--data",
        dest="csv",
        metavar="PATH",
        default=None,
        help="data with the training run's columns (.csv, .csv.gz, .parquet) [default: the "
        "run's own data]",
    )
    pr.add_argument(
        "--engine",
        choices=("onnx", "int8", "float"),
        default="onnx",
        help="onnxruntime on RUN_DIR/model.onnx, the nbqat int8 reference, or the best float "
        "weights [default: onnx]",
    )
    pr.add_argument("--out", default=None, help="output CSV [default: RUN_DIR/forecasts.csv]")
    pr.add_argument("--overwrite", action="store_true", help="replace an existing --out")
    pr.add_argument(
        "--fill-gaps",
        action="store_true",
        default=None,
        help="repair gaps before the last target value as nbqat train --fill-gaps does "
        "[default: as the run was trained]",
    )


def _backtest_options(pr: Any) -> None:
    pr.add_argument(
        "--start", metavar="TIME", default=None,
        help="first backtest origin [default: the run's test split start]",
    )  # fmt: skip
    pr.add_argument(
        "--stride", type=_positive_int, default=None,
        help="steps between backtest origins [default: the horizon]",
    )  # fmt: skip
