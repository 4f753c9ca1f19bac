"""The main job's checkpoint (``OUT/checkpoint/``): a versioned, validated schema.

Files:

* ``state.json`` -- ``{"version", "config", "state", "data", "checksum"}``: the run's resolved
  options (:class:`nbqat.train.TrainConfig` fields; ``csv`` an absolute path), the progress
  (phase, epoch, batch position, early-stopping state, curves, losses, gradient norms,
  timings), a fingerprint of the data file (absolute path, size, SHA-256) and the SHA-256 of
  the rest (:func:`digest`: an edit is refused even where every field stays in range). Strict
  JSON (an infinite best validation loss is stored as ``null``).
* ``float.npz`` -- ``params``, ``best_params`` and the Adam state (``opt``) of the float phase:
  an :mod:`nbqat.npz_state` file of format :data:`FLOAT_FORMAT` (:func:`write_float_arrays`).
  The manifest-free layout of nbqat 0.x (members ``params``, ``best_params``, ``opt.<a/0/b>``)
  still loads (:func:`load_float_state`).
* ``qat.npz`` and the ``--compare-clipping`` side files -- :meth:`nbqat.nn.qat.
  QATTemporalFusionTransformer.save` files (their own validated format).

The run folder of a checkpoint is its parent folder (never a stored path), so a moved or
copied run continues where it lies. Every inconsistency is a
:class:`~nbqat.nn.qat.CheckpointError` naming the file and the field; reading never writes.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from nbqat.npz_state import CheckpointError
from nbqat.train.checkpoint_float import (
    FLOAT_FORMAT,
    load_float_state,
    read_float_arrays,
    write_float_arrays,
)

__all__ = [
    "CHECKPOINT_VERSION",
    "PHASES",
    "FLOAT_FORMAT",
    "CheckpointError",
    "data_fingerprint",
    "digest",
    "load_float_state",
    "read_float_arrays",
    "read_state",
    "state_json",
    "write_float_arrays",
]

#: Version of the ``state.json`` schema (1: relative paths, no fingerprint; 2: no plateau
#: state; both refused).
CHECKPOINT_VERSION = 3
#: Phase names in run order.
PHASES = ("float", "calibrate", "qat", "qat_noclip", "evaluate", "done")
_STATE_KEYS = {
    "phase": str,
    "epoch": int,
    "batch_pos": int,
    "epoch_loss_sum": float,
    "best_val": float,
    "best_epoch": int,
    "bad_epochs": int,
    "stopped_early": bool,
    "lr_factor": float,
    "plateau_epoch": int,
    "curves": dict,
    "step_losses": dict,
    "grad_norms": dict,
    "timings": dict,
}


def data_fingerprint(path: str | Path) -> dict:
    """``{"path", "bytes", "sha256"}`` of a data file (absolute path; content hash).

    Parameters
    ----------
    path : str or Path
        The data file (read in 4 MB blocks).

    Returns
    -------
    dict
    """
    p = Path(path).resolve()
    h = hashlib.sha256()
    with open(p, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            h.update(block)
    return {"path": str(p), "bytes": p.stat().st_size, "sha256": h.hexdigest()}


def state_json(config: dict, state: dict, data: dict) -> str:
    """The ``state.json`` text (strict JSON: raises ValueError on a NaN anywhere).

    Parameters
    ----------
    config : dict
        The resolved options (``TrainConfig.to_json()``).
    state : dict
        The progress (``asdict`` of the run state); an infinite ``best_val`` is stored as null.
    data : dict
        :func:`data_fingerprint` of the data file.

    Returns
    -------
    str
    """
    st = dict(state)
    if st.get("best_val") is not None and math.isinf(st["best_val"]):
        st["best_val"] = None
    meta = {"version": CHECKPOINT_VERSION, "config": config, "state": st, "data": data}
    meta["checksum"] = digest(meta)
    return json.dumps(meta, indent=1, allow_nan=False)


def digest(meta: dict) -> str:
    """SHA-256 of ``meta`` without its ``checksum`` (canonical JSON: sorted keys, no spaces).

    Parameters
    ----------
    meta : dict
        The ``state.json`` content.

    Returns
    -------
    str
        Hex digest; ``state.json`` stores it as ``checksum``, so an edited or damaged file whose
        fields are all still in range is refused too.
    """
    body = {k: v for k, v in meta.items() if k != "checksum"}
    text = json.dumps(body, sort_keys=True, separators=(",", ":"), allow_nan=False)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _err(file: Path, field: str, what: str) -> CheckpointError:
    return CheckpointError(f"{file}: field {field!r}: {what}")


def _check_type(file: Path, field: str, v: Any, typ: type, allow_none: bool = False) -> None:
    if v is None and allow_none:
        return
    ok = isinstance(v, typ) and not (typ in (int, float) and isinstance(v, bool))
    if typ is float and isinstance(v, int) and not isinstance(v, bool):
        ok = True
    if not ok:
        raise _err(file, field, f"expected {typ.__name__}, got {type(v).__name__} {v!r}")
    if typ is float and v is not None and math.isnan(v):
        raise _err(file, field, "is NaN")


def _check_config(
    file: Path, cfg: Any, checks: Mapping[str, Callable[[Any], str | None]], optional: set
) -> None:
    """Every option of ``cfg`` present (but the ``optional`` ones), known and accepted by its
    check (the job's schema: the range rules live in the job's options registry, not here)."""
    if not isinstance(cfg, dict):
        raise _err(file, "config", f"expected an object, got {type(cfg).__name__}")
    extra = sorted(set(cfg) - set(checks))
    missing = sorted(set(checks) - set(cfg) - optional)
    if extra:
        raise _err(file, f"config.{extra[0]}", "unknown option (an edited or foreign file?)")
    if missing:
        raise _err(file, f"config.{missing[0]}", "missing")
    for k, check in checks.items():
        if k not in cfg:
            continue
        why = check(cfg[k])
        if why is not None:
            raise _err(file, f"config.{k}", why)
    if cfg.get("csv") is not None and not Path(cfg["csv"]).is_absolute():
        raise _err(file, "config.csv", f"expected an absolute path, got {cfg['csv']!r}")


def _check_lists(file: Path, name: str, d: Any, nested: bool) -> None:
    if not isinstance(d, dict):
        raise _err(file, f"state.{name}", "expected an object")
    for ph, v in d.items():
        if ph not in PHASES:
            raise _err(file, f"state.{name}.{ph}", f"unknown phase (known: {list(PHASES)})")
        items = v.items() if nested and isinstance(v, dict) else [("", v)]
        if nested and not isinstance(v, dict):
            raise _err(file, f"state.{name}.{ph}", "expected an object")
        for key, lst in items:
            where = f"state.{name}.{ph}" + (f".{key}" if key else "")
            if not isinstance(lst, list):
                raise _err(file, where, "expected a list of numbers")
            for x in lst:
                if isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x):
                    raise _err(file, where, f"holds {x!r}, not a finite number")


def _check_state(file: Path, st: Any, cfg: dict) -> None:
    if not isinstance(st, dict):
        raise _err(file, "state", "expected an object")
    extra = sorted(set(st) - set(_STATE_KEYS))
    missing = sorted(set(_STATE_KEYS) - set(st))
    if extra or missing:
        k = (extra or missing)[0]
        raise _err(file, f"state.{k}", "unknown field" if extra else "missing")
    for k, typ in _STATE_KEYS.items():
        _check_type(file, f"state.{k}", st[k], typ, allow_none=(k == "best_val"))
    phase = st["phase"]
    if phase not in PHASES:
        raise _err(file, "state.phase", f"unknown phase {phase!r} (known: {list(PHASES)})")
    limit = {"float": cfg["epochs"], "qat": cfg["qat_epochs"], "qat_noclip": cfg["qat_epochs"]}
    if not 0 <= st["epoch"] <= limit.get(phase, 0):
        raise _err(
            file, "state.epoch", f"{st['epoch']} outside [0, {limit.get(phase, 0)}] ({phase})"
        )
    if st["batch_pos"] < 0 or (phase not in limit and st["batch_pos"]):
        raise _err(file, "state.batch_pos", f"{st['batch_pos']} is not valid in phase {phase}")
    if not -1 <= st["best_epoch"] < cfg["epochs"]:
        raise _err(file, "state.best_epoch", f"{st['best_epoch']} outside [-1, {cfg['epochs']})")
    if phase != "float" and st["best_val"] is None:
        raise _err(file, "state.best_val", f"no best float weights, but phase is {phase}")
    if not -1 <= st["plateau_epoch"] < cfg["epochs"]:
        raise _err(
            file, "state.plateau_epoch", f"{st['plateau_epoch']} outside [-1, {cfg['epochs']})"
        )
    want = 1.0 if st["plateau_epoch"] < 0 else cfg["plateau_factor"]
    if st["lr_factor"] != want:
        raise _err(
            file,
            "state.lr_factor",
            f"{st['lr_factor']!r}, expected {want!r} (plateau_epoch "
            f"{st['plateau_epoch']}, config.plateau_factor {cfg['plateau_factor']!r})",
        )
    if st["bad_epochs"] < 0 or st["bad_epochs"] > cfg["epochs"]:
        raise _err(file, "state.bad_epochs", f"{st['bad_epochs']} outside [0, {cfg['epochs']}]")
    if phase == "qat_noclip" and not cfg["compare_clipping"]:
        raise _err(file, "state.phase", "qat_noclip without config.compare_clipping")
    _check_lists(file, "curves", st["curves"], nested=True)
    _check_lists(file, "step_losses", st["step_losses"], nested=False)
    _check_lists(file, "grad_norms", st["grad_norms"], nested=False)
    n_val = len(st["curves"].get("float", {}).get("val", []))
    if phase == "float" and n_val != st["epoch"]:
        raise _err(file, "state.curves.float.val", f"{n_val} entries for epoch {st['epoch']}")
    for k in ("best_epoch", "plateau_epoch"):  # an epoch that was evaluated (-1: none)
        if st[k] >= n_val:
            raise _err(file, f"state.{k}", f"{st[k]}, but {n_val} float epochs were evaluated")
    if st["plateau_epoch"] >= 0 and cfg["plateau_factor"] == 0:
        raise _err(
            file,
            "state.plateau_epoch",
            f"{st['plateau_epoch']}, but config.plateau_factor is 0 (the first plateau stops)",
        )
    if not isinstance(st["timings"], dict) or any(
        not isinstance(v, (int, float)) or isinstance(v, bool) or not 0 <= v < math.inf
        for v in st["timings"].values()
    ):
        raise _err(file, "state.timings", "expected non-negative seconds per phase")


def read_state(
    ck: str | Path,
    config_fields: Mapping[str, Callable[[Any], str | None]],
    legacy: Mapping[str, Any] | None = None,
) -> dict:
    """Read and validate ``ck/state.json``; nothing is written.

    Parameters
    ----------
    ck : str or Path
        The checkpoint folder (or a file inside it).
    config_fields : mapping
        The schema of ``config``: ``{option: check}``, ``check(value)`` returning what is wrong
        with ``value`` ("expected ..., got ...") or None (the job's
        :func:`nbqat.train.checkpointing.config_schema`, built from its options registry).
    legacy : mapping, optional
        ``{option: value}`` of options added after the file's release: filled in if missing.

    Returns
    -------
    dict
        ``{"version", "config", "state", "data", "folder"}``: ``folder`` is the checkpoint
        folder (absolute), ``config["out"]`` its parent (the run folder) and a ``null``
        ``best_val`` is ``inf``.

    Raises
    ------
    FileNotFoundError
        When ``ck`` holds no ``state.json``.
    CheckpointError
        For unreadable JSON, a wrong version, or any field of the wrong type, out of range or
        inconsistent with another (the message names the file and the field).
    """
    folder = Path(ck).resolve()
    if folder.is_file():
        folder = folder.parent
    file = folder / "state.json"
    if not file.is_file():
        raise FileNotFoundError(
            f"--resume {str(ck)!r}: not a checkpoint folder (no state.json); pass the "
            "checkpoint/ folder inside a previous run's --out"
        )
    try:
        meta = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise CheckpointError(f"{file}: not readable JSON ({e})") from None
    if not isinstance(meta, dict):
        raise _err(file, "(top level)", "expected an object")
    if meta.get("version") != CHECKPOINT_VERSION:
        raise _err(
            file,
            "version",
            f"{meta.get('version')!r}; this nbqat reads {CHECKPOINT_VERSION} (a checkpoint of "
            "an older nbqat cannot be resumed: start a new run)",
        )
    extra = sorted(set(meta) - {"version", "config", "state", "data", "checksum"})
    if extra:
        raise _err(file, extra[0], "unknown field")
    _check_config(file, meta.get("config"), config_fields, set(legacy or ()))
    _check_state(file, meta.get("state"), meta["config"])
    data = meta.get("data")
    if not isinstance(data, dict) or set(data) != {"path", "bytes", "sha256"}:
        raise _err(file, "data", "expected {path, bytes, sha256}")
    if meta.get("checksum") != digest(meta):
        raise _err(
            file,
            "checksum",
            "missing"
            if "checksum" not in meta
            else "the content does not match it: the file "
            "was edited or damaged; resume from an untouched checkpoint or start a new run",
        )
    if meta["state"]["best_val"] is None:
        meta["state"]["best_val"] = math.inf
    meta["config"] = {**(legacy or {}), **meta["config"], "out": str(folder.parent)}
    meta["folder"] = str(folder)
    return meta


def check_data(meta: dict, fingerprint: dict) -> None:
    """Raise CheckpointError when the data file changed since the checkpoint was written.

    Parameters
    ----------
    meta : dict
        :func:`read_state`'s result.
    fingerprint : dict
        :func:`data_fingerprint` of the data file now.
    """
    file = Path(meta["folder"]) / "state.json"
    old = meta["data"]
    # Not the path: the data is read from the stored path, and the shipped file's path moves
    # with the installation (the content is what must not change).
    for k in ("bytes", "sha256"):
        if old[k] != fingerprint[k]:
            raise _err(
                file,
                f"data.{k}",
                f"the data file changed since the checkpoint was written ({old[k]!r} then, "
                f"{fingerprint[k]!r} now); resume with the same data or start a new run",
            )


def __getattr__(name: str) -> Any:
    if name == "read_run_config":  # it builds the job's TrainConfig: it lives with the job
        raise AttributeError(
            f"{__name__}.read_run_config moved to nbqat.train.read_run_config (the job's "
            "schema lives with the job; this module only validates against it)"
        )
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
