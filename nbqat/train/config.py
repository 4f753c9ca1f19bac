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
    check_qat_options,
    check_skip_options,
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
NOT_IN_METRICS_AT_DEFAULT = {"model": "tft", "window_norm": "auto"}
#: Options that only some forecasters read: option -> the ``--model`` values that read it
#: (from the registry; any other model refuses the option).
MODEL_OPTIONS: dict[str, tuple[str, ...]] = {
    o.name: o.models
    for o in config_options().values()
    if set(o.models) != set(config_options()["model"].choices or ())
}


#: The class-body default of every :class:`TrainConfig` field: :func:`_registry_fields` puts the
#: registry's in its place (a default at all keeps ``TrainConfig(epochs=3)`` well-typed).
_FROM_REGISTRY: Any = object()


def _registry_fields(cls: type) -> type:
    """Give each option declared ``name: type = _FROM_REGISTRY`` on ``cls`` its dataclass field:
    the registry's default, the Option as metadata (apply before ``@dataclass``). The class body
    names each option once (its order is the fields' order, metrics.json's) and must name every
    option of the registry."""
    opts = config_options()
    names = [n for n in cls.__annotations__ if getattr(cls, n, None) is _FROM_REGISTRY]
    if sorted(names) != sorted(opts):
        diff = sorted(set(opts) ^ set(names))
        raise TypeError(f"{cls.__name__}'s options and the registry's differ in {diff}")
    for n in names:
        setattr(cls, n, field(default=opts[n].default, metadata={"option": opts[n]}))
    return cls


class TrainingInterrupted(Exception):
    """Raised after Ctrl-C once the checkpoint is written (the CLI exits with status 130)."""


# ------------------------------------------------------------------------------------- config


@dataclass
@_registry_fields
class TrainConfig:
    """All options of a training run (``nbqat train --help`` documents each).

    ``None`` means "the default of the mode": :meth:`resolved` fills in the full-run defaults or,
    with ``quick=True``, the quick ones. Each field's default comes from the registry.
    """

    epochs: int | None = _FROM_REGISTRY
    qat_epochs: int | None = _FROM_REGISTRY
    batch_size: int | None = _FROM_REGISTRY
    hidden_dim: int | None = _FROM_REGISTRY
    heads: int | None = _FROM_REGISTRY
    lr: float | None = _FROM_REGISTRY
    qat_lr: float | None = _FROM_REGISTRY
    max_norm: float | None = _FROM_REGISTRY
    patience: int | None = _FROM_REGISTRY
    calibration_batches: int | None = _FROM_REGISTRY
    windows_per_epoch: int | None = _FROM_REGISTRY
    seed: int = _FROM_REGISTRY
    device: str = _FROM_REGISTRY
    compare_clipping: bool = _FROM_REGISTRY
    quick: bool = _FROM_REGISTRY
    progress: bool = _FROM_REGISTRY
    plots: bool = _FROM_REGISTRY
    out: str = _FROM_REGISTRY
    csv: str | None = _FROM_REGISTRY
    time_col: str | None = _FROM_REGISTRY
    target_col: str | None = _FROM_REGISTRY
    entity_col: str | None = _FROM_REGISTRY
    known_cols: str | None = _FROM_REGISTRY
    static_cols: str | None = _FROM_REGISTRY
    observed_cols: str | None = _FROM_REGISTRY
    fill_gaps: bool = _FROM_REGISTRY
    history: int | str | None = _FROM_REGISTRY  # a positive int, or "auto"
    horizon: int | None = _FROM_REGISTRY
    eval_stride: int | None = _FROM_REGISTRY
    calendar: str = _FROM_REGISTRY
    threads: int | None = _FROM_REGISTRY
    stop_after_steps: int | None = _FROM_REGISTRY
    linear_skip: bool = _FROM_REGISTRY
    skip_history: int | str | None = _FROM_REGISTRY  # a positive int, or "auto"
    weight_decay: float | None = _FROM_REGISTRY
    warmup_steps: int | None = _FROM_REGISTRY
    skip_lr_scale: float | None = _FROM_REGISTRY
    qat_skip_lr_scale: float | None = _FROM_REGISTRY
    dropout: float | None = _FROM_REGISTRY
    ema_decay: float | None = _FROM_REGISTRY
    plateau_factor: float | None = _FROM_REGISTRY
    overwrite: bool = _FROM_REGISTRY
    observer: str = _FROM_REGISTRY
    sensitivity: bool = _FROM_REGISTRY
    float_fallback: int = _FROM_REGISTRY
    model: str = _FROM_REGISTRY
    weight_bits: int = _FROM_REGISTRY
    group_size: int | None = _FROM_REGISTRY
    weight_dtype: str = _FROM_REGISTRY
    window_norm: str = _FROM_REGISTRY

    #: ``{option: default}`` that :meth:`resolved` fills in for ``None`` (the full run's, and
    #: ``--quick``'s), from the registry.
    FULL: ClassVar[dict[str, Any]] = mode_defaults(quick=False)
    QUICK: ClassVar[dict[str, Any]] = mode_defaults(quick=True)

    def __post_init__(self) -> None:
        import os

        import numpy as np

        for f in fields(self):  # plain JSON values for state.json and metrics.json: a Path or a
            v = getattr(self, f.name)  # NumPy scalar failed their write after the training
            if isinstance(v, os.PathLike):
                setattr(self, f.name, os.fspath(v))
            elif isinstance(v, np.generic):
                setattr(self, f.name, v.item())
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
        check_skip_options(self.linear_skip, changed)  # no skip: its options would be ignored

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
        check_qat_options(self.qat_epochs, ["compare_clipping"] if self.compare_clipping else [])
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

        return weight_format_qconfig(activation_qconfig(self.qat_observer()), self)

    def qat_observer(self) -> str:
        """The activation observer of the main QAT run: ``--observer``; ``all`` (every observer
        compared after PTQ) trains with min/max."""
        return self.observer if self.observer != "all" else "minmax"

    def to_json(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}
