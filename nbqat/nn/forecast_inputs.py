"""The forecasters' input contract, checked in one place: ``(static, historical, future)``
float arrays of the config's sizes with one batch size, and the ``grad_out`` of their backward.

:class:`~nbqat.nn.TemporalFusionTransformer` and :class:`~nbqat.nn.LSTMForecaster` take the
same three inputs (``config``: a :class:`~nbqat.nn.tft.ForecasterSizes`), so both check them
here, with the same messages.
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["check_forecast_inputs", "check_grad_out"]


def check_forecast_inputs(
    config: Any, static: Any, historical: Any, future: Any, dtype: Any
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(static, historical, future)`` checked against ``config`` and C-contiguous in ``dtype``.

    Parameters
    ----------
    config : ForecasterSizes
        ``num_static_features``, ``input_length``, ``num_unknown_features``,
        ``prediction_horizon`` and ``num_known_features`` give the shapes.
    static : ndarray (B, num_static_features)
    historical : ndarray (B, input_length, num_unknown_features)
    future : ndarray (B, prediction_horizon, num_known_features)
    dtype : numpy dtype
        The model's dtype (the arrays are cast to it).

    Returns
    -------
    static, historical, future : ndarray

    Raises
    ------
    ValueError
        An input that is not a float32/float64 NumPy array of its shape (B >= 1), or batch
        sizes that differ.
    """
    c = config
    static = _check_input(static, "static", (-1, c.num_static_features), dtype)
    historical = _check_input(
        historical, "historical", (-1, c.input_length, c.num_unknown_features), dtype
    )
    future = _check_input(future, "future", (-1, c.prediction_horizon, c.num_known_features), dtype)
    nb = static.shape[0]
    if historical.shape[0] != nb or future.shape[0] != nb:
        raise ValueError(
            f"static, historical and future must share the batch size, got "
            f"{static.shape[0]}, {historical.shape[0]}, {future.shape[0]}"
        )
    return static, historical, future


def check_grad_out(grad_out: Any, shape: tuple[int, ...], dtype: Any) -> np.ndarray:
    """A forecaster's ``grad_out`` C-contiguous in ``dtype``, checked against the last output.

    Parameters
    ----------
    grad_out : ndarray
    shape : tuple of int
        The last forward's output shape ``(B, prediction_horizon, num_quantiles)``.
    dtype : numpy dtype

    Returns
    -------
    ndarray

    Raises
    ------
    ValueError
        ``grad_out`` is not an ndarray of ``shape`` (the message names ``grad_out``, not the
        layer that reads it).
    """
    if not isinstance(grad_out, np.ndarray) or grad_out.shape != shape:
        got = getattr(grad_out, "shape", type(grad_out))
        raise ValueError(
            f"grad_out must be an ndarray of the last output's shape {shape}, got {got}"
        )
    return np.ascontiguousarray(grad_out, dtype=dtype)


def _check_input(x: Any, name: str, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """Validate ``x`` against ``shape`` (-1 = any batch) and return it C-contiguous in dtype."""
    if not isinstance(x, np.ndarray):
        raise ValueError(f"{name} must be a NumPy array of shape {_fmt(shape)}, got {type(x)}")
    if x.dtype not in (np.float32, np.float64):
        raise ValueError(
            f"{name} must be float32 or float64 of shape {_fmt(shape)}, got dtype {x.dtype}: "
            f"use {name}.astype(np.float32)"
        )
    if x.ndim != len(shape) or any(s != -1 and a != s for a, s in zip(x.shape, shape)):
        raise ValueError(f"{name} must have shape {_fmt(shape)}, got {x.shape}")
    if x.shape[0] < 1:
        raise ValueError(f"{name} must have a batch of at least 1, got {x.shape}")
    return np.ascontiguousarray(x, dtype=dtype)


def _fmt(shape: tuple[int, ...]) -> str:
    return "(" + ", ".join("B" if s == -1 else str(s) for s in shape) + ")"
