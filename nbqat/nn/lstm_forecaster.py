"""A second forecaster: an LSTM encoder and an MLP quantile head (QAT'd via prepare_qat).

Data flow (B batch, k history steps, tau horizon, d hidden, Q quantiles)::

    h_k        = LSTM(historical)[final hidden state]                (B, d), from zeros
    z_t        = [h_k, future_t, static]                              (B, tau, d + m_x + m_s)
    quantiles  = head(ELU(fc(z_t)))                                   (B, tau, Q)

The same inputs and outputs as :class:`~nbqat.nn.TemporalFusionTransformer`, so the main job,
:func:`nbqat.nn.train_step`, :func:`~nbqat.nn.prepare_qat` and :func:`~nbqat.nn.convert` take
it as they take the TFT. A plain baseline architecture (an LSTM encoder with a direct
multi-horizon MLP decoder, as in Wen et al.'s MQ-RNN family without its context MLPs).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from nbqat._docs import FORECAST_IO, fill_doc
from nbqat.nn.forecast_inputs import check_forecast_inputs, check_grad_out
from nbqat.nn.layers import ELU, LSTM, Linear
from nbqat.nn.params import BufferedModel, ParameterBuffer
from nbqat.nn.tft import ForecasterSizes

__all__ = ["LSTMForecaster", "LSTMForecasterConfig"]


@dataclass
class LSTMForecasterConfig(ForecasterSizes):
    """Sizes of an :class:`LSTMForecaster` (the field names of :class:`~nbqat.nn.TFTConfig`).

    Parameters
    ----------
    num_static_features : int
        m_s, static inputs per entity.
    num_known_features : int
        m_x, known inputs per future step.
    num_unknown_features : int
        m_z, observed inputs per history step.
    hidden_dim : int
        d, the LSTM state and the MLP width.
    sequence_length : int
        k, history steps.
    prediction_horizon : int
        tau, forecast steps.
    quantiles : tuple of float, default (0.1, 0.5, 0.9)
        Strictly increasing, in (0, 1).

    Raises
    ------
    ValueError
        A size that is not a positive int, or bad quantiles (as :class:`~nbqat.nn.TFTConfig`).
    """


class LSTMForecaster(BufferedModel):
    """LSTM encoder + MLP quantile head (see the module docstring for the data flow).

    Parameters
    ----------
    config : LSTMForecasterConfig
    seed : int, default 0
        Seed of the parameter initialisation (torch's default schemes).
    dtype : float32 or float64, default float32

    Raises
    ------
    TypeError
        ``config`` is not an LSTMForecasterConfig.
    """

    #: The quantile head, kept in float by :func:`~nbqat.nn.prepare_qat` unless
    #: ``QATConfig.quantize_output_head``.
    output_head = "head"

    def __init__(self, config: LSTMForecasterConfig, seed: int = 0, dtype: Any = np.float32):
        super().__init__()
        if not isinstance(config, LSTMForecasterConfig):
            raise TypeError(f"config must be an LSTMForecasterConfig, got {type(config)}")
        c = config
        d = c.hidden_dim
        self.config = c
        self.encoder = LSTM(c.num_unknown_features, d)
        self.fc = Linear(d + c.num_known_features + c.num_static_features, d)
        self.act = ELU()
        self.head = Linear(d, c.num_quantiles)
        self.buffer = ParameterBuffer(self, dtype, seed)
        self.dtype = np.dtype(dtype)

    @fill_doc(
        forecast_io=FORECAST_IO.format(cast="cast to the model's dtype", out=", the model's dtype")
    )
    def forward(self, static: np.ndarray, historical: np.ndarray, future: np.ndarray) -> Any:
        """Quantile forecasts.

        {forecast_io}

        Raises
        ------
        ValueError
            An input that is not a float32/float64 array of its shape (B >= 1), or batch
            sizes that differ.
        """
        dt = self.dtype
        s, h, f = check_forecast_inputs(self.config, static, historical, future, dt)
        nb, d, tau = s.shape[0], self.config.hidden_dim, self.config.prediction_horizon
        zeros = np.zeros((nb, d), dt)
        _, (h_k, _) = self.encoder.forward(h, zeros, zeros)
        z = np.concatenate(
            [
                np.broadcast_to(h_k[:, None], (nb, tau, d)),
                f,
                np.broadcast_to(s[:, None], (nb, tau, s.shape[1])),
            ],
            axis=2,
        )
        self._cache = (nb, d, f.shape[2], h.shape[1])
        return self.head.forward(self.act.forward(self.fc.forward(z)))

    def backward(self, grad_out: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Backpropagate; parameter gradients accumulate (``+=``) into :attr:`grads`.

        Parameters
        ----------
        grad_out : ndarray (B, prediction_horizon, num_quantiles)

        Returns
        -------
        (dstatic, dhistorical, dfuture), shapes of the inputs

        Raises
        ------
        RuntimeError
            Before any forward.
        ValueError
            When ``grad_out`` is not an ndarray of the last forward's output shape.
        """
        nb, d, mx, k = self._require_forward()
        shape = (nb, self.config.prediction_horizon, self.config.num_quantiles)
        g = check_grad_out(grad_out, shape, self.dtype)
        dz = self.fc.backward(self.act.backward(self.head.backward(g)))
        dh_k = dz[:, :, :d].sum(axis=1)
        dfuture = np.ascontiguousarray(dz[:, :, d : d + mx])
        dstatic = dz[:, :, d + mx :].sum(axis=1)
        dout = np.zeros((nb, k, d), self.dtype)
        dhist, _, _ = self.encoder.backward(dout, dh_k, None)
        return dstatic, dhist, dfuture
