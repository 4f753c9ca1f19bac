"""Checkpoints of QAT models: the whole QAT state as one validated ``.npz`` file.

:class:`QATCheckpoint` gives :meth:`~QATCheckpoint.save` / :meth:`~QATCheckpoint.load` to every
QAT model (:class:`~nbqat.nn.qat.QATTemporalFusionTransformer` and the generic
:class:`~nbqat.nn.quantize.QATModel` of :func:`~nbqat.nn.prepare_qat`), written with the one
codec :mod:`nbqat.npz_state` (format ``"nbqat.qat"``, version 1). Stored: the flat float
weights, the network's class name and config (a dataclass), every quantizer's ``state_dict``
and flags, the phase, calibration count and step, and the optimizer's ``state_dict`` (its
parameter groups, e.g. the LSQ scales', included). No pickles.
The in-memory twin (torch's ``state_dict`` / ``load_state_dict``) is
:class:`nbqat.nn.qat_state_dict.QATStateDict`, over the same pieces.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import asdict, is_dataclass
from typing import Any

import numpy as np

from nbqat.nn.phases import CALIBRATION, QAT
from nbqat.npz_state import CheckpointError, load_state, save_state

__all__ = [
    "FORMAT",
    "VERSION",
    "QATCheckpoint",
    "check_phase_state",
    "read_checkpoint",
    "saved_network",
]

#: Format name and version of QAT checkpoints.
FORMAT = "nbqat.qat"
VERSION = 1
_PHASE_INTS = ("calibration_batches_seen", "step")
_PHASE_FLAGS = ("observers_frozen", "calibration_ended")


def check_phase_state(st: Any) -> dict:
    """The checked phase state of a checkpoint or of a state_dict's ``"_extra_state"``.

    Parameters
    ----------
    st : mapping
        ``{"phase", "observers_frozen", "calibration_batches_seen", "calibration_ended",
        "step"}`` (further keys, a file's ``"config"``, are ignored).

    Returns
    -------
    dict
        Those five, as str, bools and ints.

    Raises
    ------
    CheckpointError
        A missing entry, an unknown phase, a count that is not an int >= 0, a flag that is not
        a bool (or 0 / 1).
    """
    if not isinstance(st, Mapping):
        raise CheckpointError(f"the phase state must be a dict, got {type(st).__name__}")
    missing = [k for k in ("phase", *_PHASE_FLAGS, *_PHASE_INTS) if k not in st]
    if missing:
        raise CheckpointError(f"the phase state lacks {missing}")
    if st["phase"] not in (CALIBRATION, QAT):
        raise CheckpointError(f"unknown phase {st['phase']!r} (expected {CALIBRATION!r}/{QAT!r})")
    out: dict[str, Any] = {"phase": str(st["phase"])}
    for k in _PHASE_INTS:
        v = st[k]
        if isinstance(v, bool | np.bool_) or not isinstance(v, int | np.integer) or v < 0:
            raise CheckpointError(f"the phase state's {k} must be an int >= 0, got {v!r}")
        out[k] = int(v)
    for k in _PHASE_FLAGS:
        v = st[k]
        if not isinstance(v, bool | np.bool_ | int | np.integer) or v not in (0, 1):
            raise CheckpointError(f"the phase state's {k} must be a bool, got {v!r}")
        out[k] = bool(v)
    return out


def read_checkpoint(path: str | os.PathLike) -> dict:
    """The validated top level of a QAT checkpoint.

    Parameters
    ----------
    path : str or os.PathLike
        A file written by :meth:`QATCheckpoint.save`.

    Returns
    -------
    dict
        ``{"model": {"params", "dtype", "config", "class"?}, "qat", "quantizers",
        "optimizer"}``.

    Raises
    ------
    FileNotFoundError, CheckpointError
        As :func:`nbqat.npz_state.load_state`; a missing top-level entry.
    """
    path = os.fspath(path)
    st = load_state(path, format=FORMAT, version=VERSION)
    if not isinstance(st, dict) or not all(k in st for k in ("model", "qat", "quantizers")):
        raise CheckpointError(f"{path!r}: corrupt checkpoint (missing model/qat/quantizers)")
    return st


def saved_network(path: str | os.PathLike, config_cls: type, qat_config: Any) -> tuple:
    """The network config, dtype and QATConfig a checkpoint was saved with.

    Parameters
    ----------
    path : str or os.PathLike
        A QAT checkpoint.
    config_cls : type
        The network's config dataclass (``TFTConfig``, ``LSTMForecasterConfig``).
    qat_config : QATConfig or None
        Returned as is when given; None: the saved QATConfig's scalar fields.

    Returns
    -------
    (config, dtype, QATConfig)

    Raises
    ------
    FileNotFoundError, CheckpointError
        An unreadable file, or saved fields that do not build the configs.
    """
    from nbqat.quantization.qconfig import QATConfig

    st = read_checkpoint(path)
    try:
        mcfg = dict(st["model"]["config"])
        if "quantiles" in mcfg:
            mcfg["quantiles"] = tuple(mcfg["quantiles"])
        dtype = np.dtype(st["model"]["dtype"])
        fields = dict(st["qat"]["config"])
        fields.setdefault("quantize_linear_skip", True)  # written before the field: quantized
        qcfg = QATConfig(**fields) if qat_config is None else qat_config
        return config_cls(**mcfg), dtype, qcfg
    except (KeyError, TypeError, ValueError) as e:
        raise CheckpointError(f"{os.fspath(path)!r}: corrupt checkpoint ({e})") from e


def _config_dict(mcfg: Any) -> dict | None:
    return asdict(mcfg) if is_dataclass(mcfg) and not isinstance(mcfg, type) else None


def _norm(v: Any) -> Any:
    return list(v) if isinstance(v, tuple | list) else v


def config_scalars(config: Any) -> dict:
    """The JSON-able fields of a QATConfig (everything but the qconfig factories).

    Parameters
    ----------
    config : QATConfig

    Returns
    -------
    dict
    """
    return {
        k: v
        for k, v in vars(config).items()
        if v is None or isinstance(v, bool | int | float | str)
    }


def _copy_state(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {k: _copy_state(v) for k, v in obj.items()}
    if isinstance(obj, np.ndarray):
        return obj.copy()
    if isinstance(obj, list):
        return [_copy_state(v) for v in obj]
    if isinstance(obj, tuple):
        return tuple(_copy_state(v) for v in obj)
    return obj


class QATCheckpoint:
    """``save`` / ``load`` over a QAT model's ``model``, ``params``, ``fake_quants``, phase
    attributes, ``step`` and ``optimizer`` (see the module docstring)."""

    model: Any
    fake_quants: dict[str, Any]
    config: Any
    phase: str
    observers_frozen: bool
    calibration_batches_seen: int
    _calibration_ended: bool
    step: int
    optimizer: Any

    @property
    def params(self) -> np.ndarray:  # pragma: no cover - the model's
        """The flat parameter buffer (provided by the QAT model)."""
        raise NotImplementedError

    def _state(self, optimizer: Any) -> dict:
        quantizers = {
            name: {
                "state": dict(fq.state_dict()),
                "observer_enabled": bool(fq.observer_enabled),
                "fake_quant_enabled": bool(fq.fake_quant_enabled),
            }
            for name, fq in self.fake_quants.items()
        }
        state: dict[str, Any] = {
            "model": {
                "params": self.params.copy(),
                "dtype": str(self.params.dtype),
                "config": _config_dict(getattr(self.model, "config", None)),
                "class": type(self.model).__name__,
            },
            "qat": {**self._phase_state(), "config": config_scalars(self.config)},
            "quantizers": quantizers,
            "optimizer": None,
        }
        if optimizer is not None:
            state["optimizer"] = {
                "class": type(optimizer).__name__,
                "state": dict(optimizer.state_dict()),
            }
        return state

    def _phase_state(self) -> dict[str, Any]:
        return {
            "phase": self.phase,
            "observers_frozen": bool(self.observers_frozen),
            "calibration_batches_seen": int(self.calibration_batches_seen),
            "calibration_ended": bool(self._calibration_ended),
            "step": int(self.step),
        }

    def _set_phase_state(self, qat_st: Any) -> None:
        st = check_phase_state(qat_st)
        self.phase, self.observers_frozen = st["phase"], st["observers_frozen"]
        self.calibration_batches_seen = st["calibration_batches_seen"]
        self._calibration_ended, self.step = st["calibration_ended"], st["step"]

    def save(self, path: str | os.PathLike, optimizer: Any = None) -> None:
        """Write the whole QAT state to ``path`` as an ``.npz`` archive, atomically.

        Stored: the flat float weights, every quantizer's ``state_dict`` (observer statistics,
        scale, zero point) and flags, the phase, calibration count and step, and the optimizer's
        ``state_dict`` (step count, moment buffers, hyper-parameters, parameter groups). No
        pickles.

        Parameters
        ----------
        path : str or os.PathLike
            Destination, used exactly as given. The archive is written to a temporary file in
            the same directory, fsynced, then renamed over ``path`` (an interrupted save never
            leaves a partial file under that name).
        optimizer : optimizer, optional
            Default: the optimizer of the last :meth:`train_step` (None: no optimizer state).
        """
        opt = optimizer if optimizer is not None else self.optimizer
        save_state(path, self._state(opt), format=FORMAT, version=VERSION)

    def _check_fits(self, path: str, model_st: dict, quant_st: dict, opt: Any, opt_st: Any) -> None:
        own_cfg = _config_dict(getattr(self.model, "config", None))
        saved_cls = model_st.get("class")
        if saved_cls is not None and saved_cls != type(self.model).__name__:
            raise CheckpointError(
                f"{path!r} holds a {saved_cls}, this model is a {type(self.model).__name__}"
            )
        if own_cfg is not None and model_st.get("config") is not None:
            saved_cfg = model_st["config"]
            diff = {
                k: (saved_cfg.get(k), v)
                for k, v in own_cfg.items()
                if _norm(saved_cfg.get(k)) != _norm(v)
            }
            if diff:
                raise CheckpointError(
                    f"{path!r} holds a different network: (saved, this model) = {diff}"
                )
        params = model_st["params"]
        if (
            not isinstance(params, np.ndarray)
            or params.shape != self.params.shape
            or params.dtype != self.params.dtype
        ):
            raise CheckpointError(
                f"{path!r}: parameters {getattr(params, 'dtype', '?')}"
                f"{getattr(params, 'shape', '?')} do not fit this model's "
                f"{self.params.dtype}{self.params.shape}"
            )
        if not np.isfinite(params).all():  # as the main job's float.npz: refused, not loaded
            bad = int(np.flatnonzero(~np.isfinite(params))[0])
            raise CheckpointError(
                f"{path!r}: field 'params' holds non-finite values (params[{bad}] = "
                f"{params[bad]}): a diverged model or a damaged file; train again (a lower "
                "learning rate) or use another checkpoint"
            )
        if set(quant_st) != set(self.fake_quants):
            missing = sorted(set(self.fake_quants) - set(quant_st))
            extra = sorted(set(quant_st) - set(self.fake_quants))
            raise CheckpointError(
                f"{path!r} has another set of quantizers (QATConfig differs?): missing "
                f"{missing[:5]}, unexpected {extra[:5]}"
            )
        if opt is not None and opt_st is not None and opt_st.get("class") != type(opt).__name__:
            raise CheckpointError(
                f"{path!r} holds {opt_st.get('class')} state, the optimizer given is a "
                f"{type(opt).__name__}"
            )
        opt_params = getattr(opt, "params", None)
        if isinstance(opt_params, np.ndarray) and not np.shares_memory(opt_params, self.params):
            raise CheckpointError(
                f"{path!r}: the optimizer given updates other parameters than this model's "
                "(its state would resume nothing): build it over qat.params, e.g. "
                "nbqat.Adam(qat.params, lr=1e-3)"
            )

    def load(self, path: str | os.PathLike, optimizer: Any = None) -> None:
        """Restore a state written by :meth:`save` into this model (and ``optimizer``).

        After ``load``, the next :meth:`train_step` is bit for bit the one the saved model
        would have taken.

        Parameters
        ----------
        path : str or os.PathLike
            A checkpoint written by :meth:`save`.
        optimizer : optimizer, optional
            Receives the saved optimizer state (default: the optimizer of the last
            :meth:`train_step`, if any). Must be of the saved class and over :attr:`params`;
            a saved LSQ parameter group is added to it when it lacks one.

        Raises
        ------
        FileNotFoundError
            When ``path`` does not exist.
        CheckpointError
            (a ValueError) for a corrupt, truncated or foreign file, another format version, or
            a checkpoint of a different network (class, config, parameter count or dtype,
            quantizer set) or optimizer class, an optimizer over other parameters, or NaN / Inf
            parameters. Nothing is changed then.
        """
        path = os.fspath(path)
        st = read_checkpoint(path)
        try:
            model_st, qat_st, quant_st = st["model"], st["qat"], st["quantizers"]
            params = model_st["params"]
            opt_st = st.get("optimizer")
        except (KeyError, TypeError) as e:
            raise CheckpointError(f"{path!r}: corrupt checkpoint (missing {e})") from e
        opt = optimizer if optimizer is not None else self.optimizer
        self._check_fits(path, model_st, quant_st, opt, opt_st)
        snapshot = _copy_state(self._state(opt))
        try:
            self._restore(params, qat_st, quant_st, opt, opt_st)
        except Exception as e:
            self._restore(
                snapshot["model"]["params"],
                snapshot["qat"],
                snapshot["quantizers"],
                opt,
                snapshot["optimizer"],
            )
            raise CheckpointError(f"{path!r} does not fit this model: {e}") from e
        if opt is not None:
            self.optimizer = opt

    def _restore(self, params: Any, qat_st: dict, quant_st: dict, opt: Any, opt_st: Any) -> None:
        self.params[...] = params
        for name, fq in self.fake_quants.items():
            entry = quant_st[name]
            fq.load_state_dict(entry["state"])
            fq.enable_observer(bool(entry["observer_enabled"]))
            fq.enable_fake_quant(bool(entry["fake_quant_enabled"]))
        self._set_phase_state(qat_st)
        if opt is not None and opt_st is not None:
            saved = opt_st["state"]
            src = getattr(self, "quantizer_parameters", None)
            if saved.get("param_groups") and src is not None and not opt.has_param_group(src()):
                opt.add_param_group({"params": src()})
            opt.load_state_dict(saved)
