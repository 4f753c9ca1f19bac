"""The forecasters by name, for the main job and for scripts: build, prepare for QAT, reload.

``"tft"`` is the :class:`~nbqat.nn.TemporalFusionTransformer` (its QAT model the
:class:`~nbqat.nn.qat.QATTemporalFusionTransformer`), ``"lstm"`` the
:class:`~nbqat.nn.LSTMForecaster` (an LSTM encoder + MLP quantile head; its QAT model the
generic :class:`~nbqat.nn.quantize.QATModel` of :func:`~nbqat.nn.prepare_qat`). Both take
``(static, historical, future)`` and return ``(B, tau, Q)`` quantiles, and both QAT models
have the same interface: the phases, ``forward`` / ``predict`` / ``backward``, ``train_step``,
``fake_quants``, ``save`` / ``load`` and ``to_int8``::

    model = build_forecaster("lstm", cfg, windows)        # cfg: hidden_dim (TFT: heads, ...)
    qat = prepare_forecaster(model, QATConfig(calibration_batches=8))
    ...; qat.save("qat.npz", optimizer=opt)
    qat2 = load_qat_forecaster("qat.npz")                  # network, weights, quantizers
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

__all__ = [
    "FORECASTERS",
    "build_forecaster",
    "forecaster_name",
    "load_qat_forecaster",
    "prepare_forecaster",
]

#: The forecaster names :func:`build_forecaster` knows.
FORECASTERS = ("tft", "lstm")


def _sizes(windows: Any) -> dict[str, Any]:
    return {
        "num_static_features": int(windows.static.shape[1]),
        "num_known_features": int(windows.future_features.shape[1]),
        "num_unknown_features": int(windows.hist_features.shape[1]),
        "sequence_length": int(windows.history),
        "prediction_horizon": int(windows.horizon),
        "quantiles": tuple(windows.quantiles),
    }


def build_forecaster(name: str, cfg: Any, windows: Any, seed: int | None = None) -> Any:
    """A fresh float32 forecaster sized for ``windows``.

    Parameters
    ----------
    name : {"tft", "lstm"}
    cfg : object
        The run's options: ``hidden_dim``; for ``"tft"`` also ``heads``, ``linear_skip`` and
        ``dropout`` (e.g. the main job's ``TrainConfig``), and optionally ``skip_history``
        (int or None: the skip's history, ``windows.history``; the body then reads the last
        ``cfg.history`` steps).
    windows : nbqat.data.Windows
        Its feature counts (``static``, ``future_features``, ``hist_features``), ``history``,
        ``horizon`` and ``quantiles`` size the model.
    seed : int, optional
        Seed of the initialisation; default ``cfg.seed`` (0 without one).

    Returns
    -------
    TemporalFusionTransformer or LSTMForecaster

    Raises
    ------
    ValueError
        An unknown ``name`` (naming the known ones), or sizes the model's config refuses.
    """
    if name not in FORECASTERS:
        raise ValueError(f"unknown forecaster {name!r}: choose one of {FORECASTERS}")
    seed = int(getattr(cfg, "seed", 0)) if seed is None else int(seed)
    sizes = _sizes(windows)
    if name == "lstm":
        from nbqat.nn.lstm_forecaster import LSTMForecaster, LSTMForecasterConfig

        lcfg = LSTMForecasterConfig(hidden_dim=int(cfg.hidden_dim), **sizes)
        return LSTMForecaster(lcfg, seed=seed, dtype=np.float32)
    from nbqat.nn.tft import TemporalFusionTransformer, TFTConfig

    k_s = getattr(cfg, "skip_history", None)
    if k_s is not None:  # the windows hold the skip's history; the body reads cfg.history
        sizes["sequence_length"] = int(cfg.history)
        if int(k_s) != int(windows.history):
            raise ValueError(
                f"the windows have history {windows.history}, but cfg.skip_history is {k_s}: "
                "cut the windows with the skip's history (nbqat.train.load_data does)"
            )
    tcfg = TFTConfig(
        hidden_dim=cfg.hidden_dim,
        num_heads=cfg.heads,
        linear_skip=bool(cfg.linear_skip),
        dropout=cfg.dropout,
        skip_sequence_length=None if k_s is None else int(k_s),
        **sizes,
    )
    return TemporalFusionTransformer(tcfg, seed=seed, dtype=np.float32)


def forecaster_name(model: Any) -> str:
    """``"tft"`` or ``"lstm"`` for a float forecaster or its QAT model.

    Parameters
    ----------
    model : forecaster or QAT model

    Returns
    -------
    str

    Raises
    ------
    TypeError
        Neither forecaster.
    """
    from nbqat.nn.lstm_forecaster import LSTMForecaster
    from nbqat.nn.step import float_network
    from nbqat.nn.tft import TemporalFusionTransformer

    net = float_network(model)
    if isinstance(net, TemporalFusionTransformer):
        return "tft"
    if isinstance(net, LSTMForecaster):
        return "lstm"
    raise TypeError(f"not an nbqat forecaster: {type(net).__name__}")


def prepare_forecaster(
    model: Any, config: Any = None, qconfig: Any = None, *, inplace: bool = False
) -> Any:
    """The QAT model of a float forecaster (both through the QAT module mapping).

    Parameters
    ----------
    model : TemporalFusionTransformer or LSTMForecaster
    config : QATConfig, optional
        Default ``QATConfig()``. ``quantize_output_head=False`` (the default) keeps the
        quantile head in float for both; ``quantize_attention`` is the TFT's.
    qconfig : QConfig, optional
        Default ``config.qconfig``.
    inplace : bool, default False
        Put the quantizers into ``model`` itself (sharing its parameters) instead of a copy.

    Returns
    -------
    QATTemporalFusionTransformer or QATModel
        In the calibration phase.

    Raises
    ------
    TypeError
        ``model`` is neither forecaster, or ``config`` is not a QATConfig.
    """
    from nbqat.nn.qat import QATTemporalFusionTransformer
    from nbqat.nn.quantize import prepare_qat
    from nbqat.quantization.qconfig import QATConfig

    config = QATConfig() if config is None else config
    if not isinstance(config, QATConfig):
        raise TypeError(f"`config` must be a nbqat.QATConfig, got {type(config).__name__}")
    if forecaster_name(model) == "tft":
        return QATTemporalFusionTransformer.from_float(
            model, qconfig=qconfig, config=config, inplace=inplace
        )
    return prepare_qat(model, qconfig, config=config, inplace=inplace)  # head: QATConfig's


def load_qat_forecaster(path: str | os.PathLike, qconfig: Any = None, config: Any = None) -> Any:
    """Rebuild a forecaster's QAT model from a checkpoint alone (``qat.save(path)``).

    Parameters
    ----------
    path : str or os.PathLike
    qconfig : QConfig, optional
        Must build the saved set of quantizers (default ``config.qconfig``).
    config : QATConfig, optional
        Default: the saved QATConfig's scalar fields with the default qconfig.

    Returns
    -------
    QATTemporalFusionTransformer or QATModel
        With the saved weights, quantizer states, phase and step (no optimizer: build one over
        its ``params``, then ``load(path, optimizer=opt)``).

    Raises
    ------
    FileNotFoundError
        ``path`` does not exist.
    CheckpointError
        A corrupt, truncated or foreign file, or a network that is neither forecaster.
    """
    from nbqat.nn.lstm_forecaster import LSTMForecaster, LSTMForecasterConfig
    from nbqat.nn.qat import QATTemporalFusionTransformer
    from nbqat.nn.qat_state import read_checkpoint, saved_network
    from nbqat.npz_state import CheckpointError

    st = read_checkpoint(path)
    cls = st["model"].get("class", "TemporalFusionTransformer")
    if cls == "TemporalFusionTransformer":
        return QATTemporalFusionTransformer.from_checkpoint(path, qconfig=qconfig, config=config)
    if cls != "LSTMForecaster":
        raise CheckpointError(f"{os.fspath(path)!r} holds a {cls}, not an nbqat forecaster")
    lcfg, dtype, config = saved_network(path, LSTMForecasterConfig, config)
    model = LSTMForecaster(lcfg, dtype=dtype)
    qat = prepare_forecaster(model, config, qconfig, inplace=True)
    qat.load(path)
    return qat
