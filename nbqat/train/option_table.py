"""The table of the main job's options (:data:`OPTIONS`) and the :class:`Option` record.

Read it through :mod:`nbqat.train.options`, which builds the checks from it. The names of the
models, observers and weight formats come from where they are defined (``nbqat.nn.forecasters``,
``nbqat.train.report``, ``nbqat.quantization.qconfig``) and the engines are defined here
(``nbqat.train.predict`` imports them): never typed twice.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from nbqat.nn.forecasters import FORECASTERS
from nbqat.quantization.qconfig import WEIGHT_BITS, WEIGHT_DTYPES, WEIGHT_GROUP_SIZE
from nbqat.train.report import OBSERVERS

__all__ = [
    "COMMANDS",
    "DEFAULT_CALENDAR",
    "DEVICES",
    "ENGINES",
    "GROUPS",
    "MIN_HISTORY",
    "MODELS",
    "OBSERVER_CHOICES",
    "OPTIONS",
    "Option",
    "WINDOW_NORMS",
]

#: ``--model``'s values (the forecasters of :func:`nbqat.nn.build_forecaster`).
MODELS: tuple[str, ...] = FORECASTERS
#: ``--observer``'s values: the activation observers of :mod:`nbqat.train.report`, or all.
OBSERVER_CHOICES: tuple[str, ...] = (*OBSERVERS, "all")
#: ``--device``'s values.
DEVICES = ("cpu", "cuda")
#: ``--window-norm``'s values (:mod:`nbqat.train.window_norm`).
WINDOW_NORMS = ("auto", "none", "last")
#: ``nbqat predict --engine``'s values (``nbqat.train.predict.ENGINES`` is this tuple).
ENGINES = ("onnx", "int8", "float")
#: The commands whose options the table holds.
COMMANDS = ("train", "predict", "backtest")
#: The default history (steps) when the seasonal-naive period is shorter (``--history``).
MIN_HISTORY = 24
#: Derived known inputs used by default (see ``--calendar``).
DEFAULT_CALENDAR = "hour,dow"
#: argparse group titles (the keys are :attr:`Option.group`).
GROUPS = {
    "training": "training",
    "report": "quantization report (OUT/quant_report.json)",
    "weights": "weight format (default: per-channel int8)",
    "output": "output",
    "data": "data (default: the shipped NREL TMY3 dataset)",
    "predict": "",
}

_TRAIN = ("train",)
_PREDICT = ("predict", "backtest")


@dataclass(frozen=True)
class Option:
    """One option of the main job.

    Attributes
    ----------
    name : str
        The :class:`~nbqat.train.TrainConfig` field (argparse ``dest``; ``--name-with-dashes``).
    type : type
        ``int``, ``float``, ``str`` or ``bool``.
    default : object
        The TrainConfig field's default (``None``: the mode's, :attr:`full` / :attr:`quick`).
    help : str
        The help text without the default (``--help`` appends :meth:`default_text`).
    group : str
        A key of :data:`GROUPS`.
    full, quick : object
        The full run's and ``--quick``'s default where :attr:`default` is None
        (:attr:`UNSET`: none; ``quick`` unset: as the full run).
    low, high : float or None
        The range (None: unbounded); ``low_open`` / ``high_open`` exclude the bound.
    choices : tuple or None
        The allowed values.
    nullable : bool
        None is a valid value of a resolved configuration (``none_words``: how the command
        line spells it).
    words : tuple of str
        Words accepted besides a value of :attr:`type` (``--history auto``).
    models : tuple of str
        The ``--model`` values that read it (any other refuses it).
    commands : tuple of str
        The commands that have it.
    field : bool
        A TrainConfig field (False: a command-line control such as ``--resume``).
    cli : str
        How argparse reads it: ``"value"``, ``"flag"`` (store_true), ``"negated"``
        (``--no-<name>`` sets ``name`` False), ``"bool"`` (``--name`` / ``--no-name``),
        ``"hidden"`` (a value, not in ``--help``) or ``"positional"``.
    aliases : tuple of str
        Other spellings (``--data`` for ``--csv``).
    metavar : str or None
    default_doc : str or None
        The default as ``--help`` writes it, where it is not a value (``"--lr / 10"``).
    path : bool
        A path (an ``os.PathLike`` is accepted too).
    legacy : object
        For an option added after a release: the value that a checkpoint written without it
        means (the behaviour before the option); :attr:`UNSET`: the option is required.
    """

    UNSET: ClassVar[Any] = type("Unset", (), {"__repr__": lambda self: "UNSET"})()

    name: str
    type: type
    default: Any = None
    help: str = ""
    group: str = "training"
    full: Any = UNSET
    quick: Any = UNSET
    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False
    choices: tuple | None = None
    nullable: bool = False
    none_words: tuple[str, ...] = ()
    words: tuple[str, ...] = ()
    models: tuple[str, ...] = MODELS
    commands: tuple[str, ...] = _TRAIN
    field: bool = True
    cli: str = "value"
    aliases: tuple[str, ...] = ()
    metavar: str | None = None
    default_doc: str | None = None
    path: bool = False
    legacy: Any = UNSET

    @property
    def flag(self) -> str:
        """The command-line spelling: ``--qat-epochs``, ``--no-plots``, ``RUN_DIR``."""
        if self.cli == "positional":
            return self.metavar or self.name.upper()
        dashed = self.name.replace("_", "-")
        return f"--no-{dashed}" if self.cli == "negated" else f"--{dashed}"

    def default_text(self) -> str | None:
        """The default as ``--help`` and the docs table write it (None: a plain switch)."""
        if self.default_doc is not None:
            return self.default_doc
        if self.cli in ("flag", "negated", "positional"):
            return None
        if self.full is not Option.UNSET:
            q = self.quick
            return _show(self.full) + ("" if q is Option.UNSET else f"; --quick: {_show(q)}")
        if self.cli == "bool":
            return "on" if self.default else "off"
        return None if self.default is None else _show(self.default)


def _show(v: Any) -> str:
    return "none" if v is None else str(v)


def _opt(name: str, type_: type, default: Any = None, help: str = "", **kw: Any) -> Option:
    return Option(name, type_, default, help, **kw)


_POS = {"low": 1}  # a positive integer
_NONNEG = {"low": 0}  # >= 0
_POSF = {"low": 0, "low_open": True}  # a positive finite number
_FRACTION = {"low": 0, "high": 1, "high_open": True}  # [0, 1)
_TFT = {"models": ("tft",)}

#: Every option, in ``--help`` order within each group.
OPTIONS: tuple[Option, ...] = (
    # ------------------------------------------------------------------------- train: training
    _opt("epochs", int, None, "maximum float training epochs (early stopping may end sooner)",
         full=20, quick=4, **_POS),
    _opt("qat_epochs", int, None, "QAT fine-tuning epochs (0: none; --qat-lr, "
         "--qat-skip-lr-scale and --compare-clipping are then an error)", full=2, quick=1,
         **_NONNEG),
    _opt("batch_size", int, None, "training windows per batch", full=64, **_POS),
    _opt("model", str, "tft", "the forecaster: tft (the TFT-like network) or lstm (an LSTM "
         "encoder + MLP quantile head, nbqat.nn.LSTMForecaster)", choices=MODELS),
    _opt("hidden_dim", int, None, "hidden size d of the network", full=16, **_POS),
    _opt("heads", int, None, "attention heads (must divide --hidden-dim)", full=4, **_POS,
         **_TFT),
    _opt("lr", float, None, "AdamW learning rate of the float phase", full=3e-3, **_POSF),
    _opt("qat_lr", float, None, "AdamW learning rate of the QAT phase", default_doc="--lr / 10",
         **_POSF),
    _opt("max_norm", float, 1.0, "clip_grad_norm_ threshold ('none' to disable; the QAT "
         "model's QATConfig.max_norm)", nullable=True, none_words=("none", "off", "inf"),
         **_POSF),
    _opt("patience", int, None, "early stopping: epochs without a better validation P50 q-risk",
         full=5, quick=2, **_POS),
    _opt("plateau_factor", float, None, "at the first plateau (--patience epochs without a "
         "better validation P50), go back to the best epoch's weights and go on at this factor "
         "times the scheduled learning rate; the second plateau stops (0: stop at the first)",
         full=0.1, **_FRACTION),
    _opt("calibration_batches", int, None, "observer calibration batches "
         "(QATConfig.calibration_batches)", full=100, quick=10, **_POS),
    _opt("windows_per_epoch", int, None, "training windows drawn per epoch (0 = all)",
         full=4096, quick=1024, **_NONNEG),
    _opt("linear_skip", bool, True, "linear skip from the flattened window to the output, "
         "started at the ridge baseline (TFTConfig.linear_skip)", cli="bool", **_TFT),
    _opt("skip_history", int, None, "steps of history the linear skip reads, at least "
         "--history (the network body reads the last --history of them), or 'auto': the tuned "
         "ridge's validation choice, --history if shorter (TFTConfig.skip_sequence_length; "
         "metrics.json skip_history_choice)", full=None, words=("auto",), nullable=True,
         default_doc="--history", **_POS, **_TFT),
    _opt("weight_decay", float, None, "AdamW decoupled weight decay of the network body",
         full=0.3, **_NONNEG),
    _opt("warmup_steps", int, None, "linear learning-rate warm-up steps before the cosine decay",
         full=100, quick=10, **_NONNEG),
    _opt("dropout", float, None, "dropout probability at every GLU input in training "
         "(TFTConfig.dropout)", full=0.1, **_FRACTION, **_TFT),
    _opt("skip_lr_scale", float, None, "learning rate of the linear skip relative to --lr",
         full=0.1, **_POSF, **_TFT),
    _opt("ema_decay", float, None, "exponential moving average of the float weights (decay per "
         "step; 0: off), evaluated, early-stopped and kept as the model", full=0.0,
         **_FRACTION),
    _opt("qat_skip_lr_scale", float, None, "learning rate of the linear skip relative to "
         "--qat-lr in QAT (and in the equally fine-tuned float row)", full=0.1, **_POSF,
         **_TFT),
    _opt("seed", int, 0, "seed of initialisation and shuffling", **_NONNEG),
    _opt("device", str, "cpu", "where the kernels run; see the README for what runs on the "
         "device", choices=DEVICES),
    _opt("threads", int, None, "Numba threads for the compiled kernels; on a busy shared "
         "machine 1 is often fastest", nullable=True, default_doc="all cores", **_POS),
    _opt("compare_clipping", bool, False, "also run QAT without clipping from the same start "
         "and seed and compare", cli="flag"),
    _opt("quick", bool, False, "a small smoke configuration (about 10-20 s with a warm Numba "
         "cache)", cli="flag"),
    _opt("progress", bool, True, "no progress bars", cli="negated"),
    _opt("stop_after_steps", int, None, "testing: behave as if Ctrl-C came after N steps",
         nullable=True, cli="hidden", **_POS),
    # --------------------------------------------------------------------------- train: report
    _opt("observer", str, "minmax", "activation observer; 'all' also tabulates post-training "
         "q-risk for each", group="report", choices=OBSERVER_CHOICES),
    _opt("sensitivity", bool, False, "per-layer sensitivity (test q-risk, slow)",
         group="report", cli="flag"),
    _opt("float_fallback", int, 0, "report (quant_report.json) the q-risk recovered with the N "
         "most sensitive modules in float; the trained model and model.onnx keep them "
         "quantized", group="report", metavar="N", **_NONNEG),
    # -------------------------------------------------------------------------- train: weights
    _opt("weight_bits", int, 8, "8: per-channel int8; 4: grouped symmetric int4 weights "
         "(8-bit activations as --observer's)", group="weights", choices=WEIGHT_BITS),
    _opt("group_size", int, None, "input features per int4 weight scale (with --weight-bits 4); "
         "a layer whose width is not a multiple of G keeps 8-bit per-channel weights "
         "(quant_report.json lists them)",
         group="weights", metavar="G", nullable=True,
         default_doc=f"{WEIGHT_GROUP_SIZE} with --weight-bits 4", **_POS),
    _opt("weight_dtype", str, "int", "int: integer weights; float8_e4m3fn: float8 weights, a "
         "scale per output channel", group="weights", choices=WEIGHT_DTYPES),
    # --------------------------------------------------------------------------- train: output
    _opt("out", str, "nbqat-run", "output folder (metrics.json, timings.json, checkpoint/, "
         "*.png)", group="output", path=True),
    _opt("resume", str, None, "continue an interrupted run from its checkpoint folder "
         "(OUT/checkpoint); the other options come from the checkpoint", group="output",
         field=False, metavar="CHECKPOINT", path=True),
    _opt("plots", bool, True, "skip the PNG plots", group="output", cli="negated"),
    _opt("overwrite", bool, False, "replace a previous run's outputs in --out, kept aside until "
         "the new run finishes (a failed run puts them back; without it such an --out is "
         "refused)", group="output", cli="flag"),
    _opt("check", bool, False, "only validate the data, the options (and a --resume "
         "checkpoint); write nothing", group="output", field=False, cli="flag"),
    # ----------------------------------------------------------------------------- train: data
    _opt("csv", str, None, "your own long-format table (.csv, .csv.gz or .parquet), one row per "
         "entity and time step", group="data", nullable=True, aliases=("--data",),
         metavar="PATH", path=True),
    _opt("time_col", str, None, "time column (ISO 8601 or numbers; monthly, quarterly or "
         "yearly dates step by calendar months)", group="data", nullable=True),
    _opt("target_col", str, None, "column to forecast", group="data", nullable=True),
    _opt("entity_col", str, None, "series id column (optional)", group="data", nullable=True),
    _opt("known_cols", str, None, "comma-separated inputs known in advance", group="data",
         nullable=True),
    _opt("static_cols", str, None, "comma-separated per-entity constants", group="data",
         nullable=True),
    _opt("observed_cols", str, None, "comma-separated past-only inputs", group="data",
         nullable=True, default_doc="all other columns"),
    _opt("fill_gaps", bool, False, "repair missing steps and values instead of failing: the "
         "target and observed columns carry their last value forward (a repaired step never "
         "reads a later value; before an observed column's first value the model reads its "
         "training mean, 0 once standardised, counted as filled), the known columns are "
         "interpolated linearly unless they hold a "
         "few whole-number levels (a 0/1 flag, a category: at most 16 distinct values; carried, "
         "the summary names them); repaired target steps are inputs only: no weight in the "
         "training loss or the ridge baselines' fit, never scored in the validation, test or "
         "backtest q-risk; rows before an entity's first target value are refused (train, "
         "predict and backtest: a history there would read that later value)",
         group="data", cli="flag"),
    _opt("history", int, None, "encoder length k in steps, or 'auto': chosen on the validation "
         "split by the tuned ridge's search, history + horizon at most 240 steps (metrics.json "
         "history_choice)", group="data", full=None, words=("auto",),
         default_doc=f"{MIN_HISTORY}, or the seasonal-naive period if longer", **_POS),
    _opt("horizon", int, None, "forecast length tau in steps", group="data", full=24, **_POS),
    _opt("calendar", str, DEFAULT_CALENDAR, "derived known inputs, comma-separated from: hour "
         "(hour of day sin/cos), dow (day of week), doy (day of year sin/cos; month of year for "
         "monthly and quarterly dates, whose default is doy, as weekly data's), "
         "time_index; hour is left out at a step of a day or more, dow at whole weeks, doy at "
         "whole years (yearly dates: their default is time_index)",
         group="data"),
    _opt("eval_stride", int, None, "steps between validation/test windows", group="data",
         full=6, quick=24, **_POS),
    _opt("window_norm", str, "auto", "each window's target relative to its last history "
         "value, added back to the forecasts (NLinear's normalisation): 'last', 'none', or "
         "'auto': 'last' where the validation targets leave the training targets' range (a "
         "drifting level), else 'none' (metrics.json window_norm)", group="data",
         choices=WINDOW_NORMS, legacy="none"),
    # ------------------------------------------------------------------------ predict/backtest
    _opt("run_dir", str, None, "the --out folder of nbqat train", group="predict",
         commands=_PREDICT, field=False, cli="positional", metavar="RUN_DIR", path=True),
    _opt("csv", str, None, "data with the training run's columns (.csv, .csv.gz, .parquet)",
         group="predict", commands=_PREDICT, field=False, nullable=True, aliases=("--data",),
         metavar="PATH", default_doc="the run's own data", path=True),
    _opt("engine", str, "onnx", "onnxruntime on RUN_DIR/model.onnx, the nbqat int8 reference, "
         "or the best float weights", group="predict", commands=_PREDICT, field=False,
         choices=ENGINES),
    _opt("out", str, None, "output CSV ('-': standard output)", group="predict",
         commands=_PREDICT, field=False, nullable=True,
         default_doc="RUN_DIR/forecasts.csv; backtest: RUN_DIR/backtest.csv", path=True),
    _opt("overwrite", bool, False, "replace an existing --out", group="predict",
         commands=_PREDICT, field=False, cli="flag"),
    _opt("fill_gaps", bool, None, "repair gaps before the last target value as nbqat train "
         "--fill-gaps does", group="predict", commands=_PREDICT, field=False, cli="flag",
         nullable=True, default_doc="as the run was trained"),
    _opt("at", str, None, "forecast from origin TIME (its first forecast step is TIME) and add "
         "the column actual from the data", group="predict", commands=("predict",),
         field=False, nullable=True, metavar="TIME"),
    _opt("backtest", bool, False, "rolling-origin forecasts with actuals (as nbqat backtest; "
         "--start, --stride)", group="predict", commands=("predict",), field=False, cli="flag"),
    _opt("start", str, None, "first backtest origin", group="predict", commands=_PREDICT,
         field=False, nullable=True, metavar="TIME",
         default_doc="the run's test split start"),
    _opt("stride", int, None, "steps between backtest origins", group="predict",
         commands=_PREDICT, field=False, nullable=True, default_doc="the horizon", **_POS),
)  # fmt: skip
