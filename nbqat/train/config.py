"""The main job's options (:class:`TrainConfig`), its constants and its interrupt exception.

Each field's default, range and help come from the registry :mod:`nbqat.train.options`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any, ClassVar

from nbqat.quantization.qconfig import WEIGHT_GROUP_SIZE
from nbqat.train import checkpoint_schema as ckpt
from nbqat.train.options import (
    DEFAULT_CALENDAR,
    MIN_HISTORY,
    check_model_options,
    check_option,
    config_options,
    mode_defaults,
)

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
CHECKPOINT_VERSION = ckpt.CHECKPOINT_VERSION
#: QAT states kept beside the checkpoint by --compare-clipping (copied into checkpoint/).
SIDE_FILES = ("qat_start.npz", "qat_clipped.npz")
#: Options that do not change any result, left out of metrics.json so that two runs with the
#: same seed in different folders give the same file.
NOT_IN_METRICS = ("out", "progress", "stop_after_steps", "overwrite")
#: Options left out of metrics.json at their default (a default run's file stays as it was).
NOT_IN_METRICS_AT_DEFAULT = {"model": "tft"}
#: Options that only some forecasters read: option -> the ``--model`` values that read it
#: (from the registry; any other model refuses the option).
MODEL_OPTIONS: dict[str, tuple[str, ...]] = {
    o.name: o.models
    for o in config_options().values()
    if set(o.models) != set(config_options()["model"].choices or ())
}


def _field(name: str) -> Any:
    """The dataclass field of option ``name``: the registry's default, the Option as metadata."""
    o = config_options()[name]
    return field(default=o.default, metadata={"option": o})


class TrainingInterrupted(Exception):
    """Raised after Ctrl-C once the checkpoint is written (the CLI exits with status 130)."""


# ------------------------------------------------------------------------------------- config


@dataclass
class TrainConfig:
    """All options of a training run (``nbqat train --help`` documents each).

    ``None`` means "the default of the mode": :meth:`resolved` fills in the full-run defaults or,
    with ``quick=True``, the quick ones.
    """

    epochs: int | None = _field("epochs")
    qat_epochs: int | None = _field("qat_epochs")
    batch_size: int | None = _field("batch_size")
    hidden_dim: int | None = _field("hidden_dim")
    heads: int | None = _field("heads")
    lr: float | None = _field("lr")
    qat_lr: float | None = _field("qat_lr")
    max_norm: float | None = _field("max_norm")
    patience: int | None = _field("patience")
    calibration_batches: int | None = _field("calibration_batches")
    windows_per_epoch: int | None = _field("windows_per_epoch")
    seed: int = _field("seed")
    device: str = _field("device")
    compare_clipping: bool = _field("compare_clipping")
    quick: bool = _field("quick")
    progress: bool = _field("progress")
    plots: bool = _field("plots")
    out: str = _field("out")
    csv: str | None = _field("csv")
    time_col: str | None = _field("time_col")
    target_col: str | None = _field("target_col")
    entity_col: str | None = _field("entity_col")
    known_cols: str | None = _field("known_cols")
    static_cols: str | None = _field("static_cols")
    observed_cols: str | None = _field("observed_cols")
    fill_gaps: bool = _field("fill_gaps")
    history: int | str | None = _field("history")  # a positive int, or "auto"
    horizon: int | None = _field("horizon")
    eval_stride: int | None = _field("eval_stride")
    calendar: str = _field("calendar")
    threads: int | None = _field("threads")
    stop_after_steps: int | None = _field("stop_after_steps")
    linear_skip: bool = _field("linear_skip")
    skip_history: int | str | None = _field("skip_history")  # a positive int, or "auto"
    weight_decay: float | None = _field("weight_decay")
    warmup_steps: int | None = _field("warmup_steps")
    skip_lr_scale: float | None = _field("skip_lr_scale")
    qat_skip_lr_scale: float | None = _field("qat_skip_lr_scale")
    dropout: float | None = _field("dropout")
    ema_decay: float | None = _field("ema_decay")
    plateau_factor: float | None = _field("plateau_factor")
    overwrite: bool = _field("overwrite")
    observer: str = _field("observer")
    sensitivity: bool = _field("sensitivity")
    float_fallback: int = _field("float_fallback")
    model: str = _field("model")
    weight_bits: int = _field("weight_bits")
    group_size: int | None = _field("group_size")
    weight_dtype: str = _field("weight_dtype")

    #: ``{option: default}`` that :meth:`resolved` fills in for ``None`` (the full run's, and
    #: ``--quick``'s), from the registry.
    FULL: ClassVar[dict[str, Any]] = mode_defaults(quick=False)
    QUICK: ClassVar[dict[str, Any]] = mode_defaults(quick=True)

    def __post_init__(self) -> None:
        self._check()

    def _check(self) -> None:
        """Every field in its registry range (None where the mode fills it in), then no option
        set away from its default that ``model`` does not read (a default never refuses)."""
        for f in fields(self):
            check_option(f.name, getattr(self, f.name))
        full = mode_defaults(quick=False)
        changed = [
            f.name
            for f in fields(self)
            if getattr(self, f.name) is not None
            and getattr(self, f.name) not in (f.default, full.get(f.name, f.default))
        ]
        check_model_options(self.model, changed)
        skip = [k for k in ("skip_lr_scale", "qat_skip_lr_scale", "skip_history") if k in changed]
        if skip and not self.linear_skip:  # no skip: its options would be ignored
            opt = "--" + skip[0].replace("_", "-")
            raise ValueError(f"{opt} is an option of the linear skip, but --no-linear-skip "
                             f"removes the skip: drop {opt} or --no-linear-skip")  # fmt: skip

    @classmethod
    def from_args(cls, args: Any) -> TrainConfig:
        """Build from parsed ``nbqat train`` arguments (argparse.Namespace)."""
        opts = config_options()
        kw = {
            k: getattr(args, k)
            for k, o in opts.items()
            if hasattr(args, k) and (getattr(args, k) is not None or o.nullable)
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
        """Raise ValueError naming the option for an inconsistent configuration (each option
        in its registry range, and the rules between options)."""
        self._check()
        if self.model == "tft" and self.hidden_dim % self.heads:  # type: ignore[operator]
            raise ValueError(
                f"--heads {self.heads} must divide --hidden-dim {self.hidden_dim} "
                "(each head gets hidden_dim / heads features)"
            )
        if self.compare_clipping and self.max_norm is None:
            raise ValueError("--compare-clipping needs a --max-norm (the clipped run)")
        self._validate_weight_format()

    def _validate_weight_format(self) -> None:
        """--weight-bits / --group-size / --weight-dtype together (issue 30)."""
        if self.group_size is not None and self.weight_bits != 4:
            raise ValueError("--group-size needs --weight-bits 4 (int8 weights are per channel)")
        if self.weight_dtype != "int" and self.weight_bits != 8:
            raise ValueError("--weight-dtype float8_e4m3fn is 8-bit: drop --weight-bits 4")

    def weight_format(self) -> dict:
        """``{weight_bits, group_size, weight_dtype, name}`` of the run (metrics.json)."""
        g = (self.group_size or WEIGHT_GROUP_SIZE) if self.weight_bits == 4 else None
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
