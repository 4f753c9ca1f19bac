"""The main job's options (:class:`TrainConfig`), its constants and its interrupt exception."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass, fields
from numbers import Integral
from typing import Any

from nbqat.train import checkpoint_schema as ckpt

__all__ = [
    "CHECKPOINT_VERSION",
    "DEFAULT_CALENDAR",
    "MIN_HISTORY",
    "MODEL_OPTIONS",
    "NOT_IN_METRICS",
    "NOT_IN_METRICS_AT_DEFAULT",
    "QUANTILES",
    "SIDE_FILES",
    "TrainConfig",
    "TrainingInterrupted",
    "check_model_options",
]

QUANTILES = (0.1, 0.5, 0.9)
#: The default history (steps) when the seasonal-naive period is shorter (``--history``).
MIN_HISTORY = 24
#: Derived known inputs used by default (see ``--calendar``).
DEFAULT_CALENDAR = "hour,dow"
CHECKPOINT_VERSION = ckpt.CHECKPOINT_VERSION
#: QAT states kept beside the checkpoint by --compare-clipping (copied into checkpoint/).
SIDE_FILES = ("qat_start.npz", "qat_clipped.npz")
#: Options that do not change any result, left out of metrics.json so that two runs with the
#: same seed in different folders give the same file.
NOT_IN_METRICS = ("out", "progress", "stop_after_steps", "overwrite")
#: Options left out of metrics.json at their default (a default run's file stays as it was).
NOT_IN_METRICS_AT_DEFAULT = {"model": "tft"}


class TrainingInterrupted(Exception):
    """Raised after Ctrl-C once the checkpoint is written (the CLI exits with status 130)."""


# ------------------------------------------------------------------------------------- config


@dataclass
class TrainConfig:
    """All options of a training run (``nbqat train --help`` documents each).

    ``None`` means "the default of the mode": :meth:`resolved` fills in the full-run defaults or,
    with ``quick=True``, the quick ones.
    """

    epochs: int | None = None
    qat_epochs: int | None = None
    batch_size: int | None = None
    hidden_dim: int | None = None
    heads: int | None = None
    lr: float | None = None
    qat_lr: float | None = None
    max_norm: float | None = 1.0
    patience: int | None = None
    calibration_batches: int | None = None
    windows_per_epoch: int | None = None
    seed: int = 0
    device: str = "cpu"
    compare_clipping: bool = False
    quick: bool = False
    progress: bool = True
    plots: bool = True
    out: str = "nbqat-run"
    csv: str | None = None
    time_col: str | None = None
    target_col: str | None = None
    entity_col: str | None = None
    known_cols: str | None = None
    static_cols: str | None = None
    observed_cols: str | None = None
    fill_gaps: bool = False
    history: int | str | None = None  # a positive int, or "auto" (--history auto)
    horizon: int | None = None
    eval_stride: int | None = None
    calendar: str = DEFAULT_CALENDAR
    threads: int | None = None
    stop_after_steps: int | None = None
    linear_skip: bool = True  # the ridge-started linear skip (--no-linear-skip)
    weight_decay: float | None = None
    warmup_steps: int | None = None
    skip_lr_scale: float | None = None
    qat_skip_lr_scale: float | None = None
    dropout: float | None = None
    ema_decay: float | None = None  # EMA of the float weights, evaluated and kept (0: off)
    plateau_factor: float | None = None  # the learning rate's factor after a plateau (0: stop)
    overwrite: bool = False
    observer: str = "minmax"  # activation observer (nbqat.train.report.OBSERVERS, or "all")
    sensitivity: bool = False
    float_fallback: int = 0
    model: str = "tft"  # the forecaster (nbqat.nn.forecasters.FORECASTERS)
    weight_bits: int = 8  # --weight-bits: 8 (per-channel int8) or 4 (grouped int4)
    group_size: int | None = None  # --group-size: int4 group (default 32 with --weight-bits 4)
    weight_dtype: str = "int"  # --weight-dtype: int or float8_e4m3fn

    FULL = {
        "epochs": 20,
        "qat_epochs": 2,
        "batch_size": 64,
        "hidden_dim": 16,
        "heads": 4,
        "lr": 3e-3,
        "patience": 5,
        "calibration_batches": 100,
        "windows_per_epoch": 4096,
        "history": None,  # auto: max(24, the seasonal-naive period), see load_data
        "horizon": 24,
        "eval_stride": 6,
        "weight_decay": 0.3,
        "warmup_steps": 100,
        "skip_lr_scale": 0.1,
        "qat_skip_lr_scale": 0.1,
        "dropout": 0.1,
        "ema_decay": 0.0,
        "plateau_factor": 0.1,
    }
    QUICK = {  # --quick: the full run's options but these
        **FULL,
        "epochs": 4,
        "qat_epochs": 1,
        "patience": 2,
        "calibration_batches": 10,
        "windows_per_epoch": 1024,
        "eval_stride": 24,
        "warmup_steps": 10,
    }

    @classmethod
    def from_args(cls, args: Any) -> TrainConfig:
        """Build from parsed ``nbqat train`` arguments (argparse.Namespace)."""
        kw = {
            f.name: getattr(args, f.name)
            for f in fields(cls)
            if hasattr(args, f.name) and (getattr(args, f.name) is not None or f.name == "max_norm")
        }
        kw["progress"] = not getattr(args, "no_progress", False)
        kw["plots"] = not getattr(args, "no_plots", False)
        return cls(**kw)

    def resolved(self) -> TrainConfig:
        """A copy with every ``None`` option replaced by the mode's default, validated."""
        base = self.QUICK if self.quick else self.FULL
        kw = asdict(self)
        for k, v in base.items():
            if kw[k] is None:
                kw[k] = v
        if kw["qat_lr"] is None:
            kw["qat_lr"] = kw["lr"] / 10.0
        cfg = TrainConfig(**kw)
        cfg.validate()
        return cfg

    def validate(self) -> None:
        """Raise ValueError naming the option for an inconsistent configuration."""
        if self.model not in ("tft", "lstm"):
            raise ValueError(f"--model must be 'tft' or 'lstm', got {self.model!r}")
        if self.model == "tft" and self.hidden_dim % self.heads:  # type: ignore[operator]
            raise ValueError(
                f"--heads {self.heads} must divide --hidden-dim {self.hidden_dim} "
                "(each head gets hidden_dim / heads features)"
            )
        if isinstance(self.seed, bool) or not isinstance(self.seed, Integral) or self.seed < 0:
            raise ValueError(f"--seed must be an integer >= 0 (NumPy's seeds), got {self.seed!r}")
        if not 0.0 <= self.dropout < 1.0:  # type: ignore[operator]
            raise ValueError(f"--dropout must be in [0, 1), got {self.dropout!r}")
        if not 0.0 <= self.ema_decay < 1.0:  # type: ignore[operator]
            raise ValueError(f"--ema-decay must be in [0, 1) (0: off), got {self.ema_decay!r}")
        if not 0.0 <= self.plateau_factor < 1.0:  # type: ignore[operator]
            raise ValueError(
                f"--plateau-factor must be in [0, 1) (0: stop at the first plateau), got "
                f"{self.plateau_factor!r}"
            )
        if self.device not in ("cpu", "cuda"):
            raise ValueError(f"--device must be 'cpu' or 'cuda', got {self.device!r}")
        if self.max_norm is not None and not self.max_norm > 0:
            raise ValueError(f"--max-norm must be positive or 'none', got {self.max_norm!r}")
        if self.compare_clipping and self.max_norm is None:
            raise ValueError("--compare-clipping needs a --max-norm (the clipped run)")
        self._validate_weight_format()
        h = self.history
        if (
            h is not None
            and h != "auto"
            and (isinstance(h, bool) or not isinstance(h, Integral) or h < 1)
        ):
            raise ValueError(f"--history must be a positive integer or 'auto', got {h!r}")
        if self.observer not in ("minmax", "histogram", "percentile", "mse", "all"):
            raise ValueError(
                f"--observer must be minmax|histogram|percentile|mse|all, got {self.observer!r}"
            )

    def _validate_weight_format(self) -> None:
        """--weight-bits / --group-size / --weight-dtype (issue 30)."""
        if self.weight_bits not in (4, 8):
            raise ValueError(f"--weight-bits must be 4 or 8, got {self.weight_bits!r}")
        if self.weight_dtype not in ("int", "float8_e4m3fn"):
            raise ValueError(
                f"--weight-dtype must be 'int' or 'float8_e4m3fn', got {self.weight_dtype!r}"
            )
        g = self.group_size
        if g is not None and self.weight_bits != 4:
            raise ValueError("--group-size needs --weight-bits 4 (int8 weights are per channel)")
        if g is not None and (isinstance(g, bool) or not isinstance(g, Integral) or g < 1):
            raise ValueError(f"--group-size must be a positive integer, got {g!r}")
        if self.weight_dtype != "int" and self.weight_bits != 8:
            raise ValueError("--weight-dtype float8_e4m3fn is 8-bit: drop --weight-bits 4")

    def weight_format(self) -> dict:
        """``{weight_bits, group_size, weight_dtype, name}`` of the run (metrics.json)."""
        g = (self.group_size or 32) if self.weight_bits == 4 else None
        name = "int8" if self.weight_bits == 8 else f"int4_g{g}"
        if self.weight_dtype != "int":
            name = self.weight_dtype
        return {"weight_bits": self.weight_bits, "group_size": g,
                "weight_dtype": self.weight_dtype, "name": name}  # fmt: skip

    def qconfig(self) -> Any:
        """The QConfig of the run's QAT model: ``--observer``'s activation observer (``all``
        trains with min/max) and the ``--weight-bits`` / ``--group-size`` / ``--weight-dtype``
        weights. The one definition, for training and for loading a finished run."""
        from nbqat.quantization.qconfig import weight_format_qconfig
        from nbqat.train.report import activation_qconfig

        obs = self.observer if self.observer != "all" else "minmax"
        return weight_format_qconfig(activation_qconfig(obs), self)

    def to_json(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}


#: Options that only some forecasters read: option -> the ``--model`` values that read it.
#: Any other model refuses the option (it would be accepted and silently ignored).
MODEL_OPTIONS: dict[str, tuple[str, ...]] = {
    "heads": ("tft",),
    "dropout": ("tft",),
    "linear_skip": ("tft",),
}


def check_model_options(model: str, given: Iterable[str]) -> None:
    """Raise ValueError for an option of ``given`` that ``model`` does not read.

    Parameters
    ----------
    model : str
        The ``--model`` value.
    given : iterable of str
        The options set explicitly (TrainConfig field names); those not in
        :data:`MODEL_OPTIONS` are read by every model.

    Raises
    ------
    ValueError
        One line naming the option and the model: ``--heads is not used by --model lstm``.
    """
    for name in given:
        models = MODEL_OPTIONS.get(name, (model,))
        if model not in models:
            opt = "--" + name.replace("_", "-")
            raise ValueError(
                f"{opt} is not used by --model {model} (only by --model {', '.join(models)}): "
                f"drop {opt}, or choose --model {models[0]}"
            )


def explicit_model_options(cfg: TrainConfig) -> list[str]:
    """The :data:`MODEL_OPTIONS` that the unresolved ``cfg`` sets (not None; the linear skip
    when turned off, its default being on)."""
    out = [k for k in ("heads", "dropout") if getattr(cfg, k) is not None]
    return out + ([] if cfg.linear_skip else ["linear_skip"])
