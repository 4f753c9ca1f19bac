"""The TFT-like forecaster: configuration and the model with its hand-written backward pass."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from nbqat._docs import BACKWARD_IO, fill_doc
from nbqat._validate import check_positive_int_fields, check_quantiles
from nbqat.nn import layers
from nbqat.nn.forecast_inputs import check_forecast_inputs, check_grad_out
from nbqat.nn.layers.grn_stack import GRNStack
from nbqat.nn.params import BufferedModel, ParameterBuffer

#: The size fields every forecaster config checks as positive ints (TFTConfig adds num_heads).
FORECASTER_SIZE_FIELDS = (
    "num_static_features",
    "num_known_features",
    "num_unknown_features",
    "hidden_dim",
    "sequence_length",
    "prediction_horizon",
)


@dataclass
class ForecasterSizes:
    """The sizes every forecaster config shares (the base of :class:`TFTConfig` and
    :class:`~nbqat.nn.LSTMForecasterConfig`; see their parameters).

    Raises
    ------
    ValueError
        A size that is not a positive int, or quantiles not strictly increasing in (0, 1).
    """

    num_static_features: int
    num_known_features: int
    num_unknown_features: int
    hidden_dim: int
    sequence_length: int
    prediction_horizon: int
    quantiles: tuple[float, ...] = field(default=(0.1, 0.5, 0.9))

    def __post_init__(self) -> None:
        check_positive_int_fields(self, FORECASTER_SIZE_FIELDS)
        check_quantiles(self)

    @property
    def num_quantiles(self) -> int:
        """Q, the number of quantiles."""
        return len(self.quantiles)

    @property
    def input_length(self) -> int:
        """The steps of the ``historical`` input (here ``sequence_length``)."""
        return self.sequence_length


@dataclass
class TFTConfig(ForecasterSizes):
    """Sizes of :class:`TemporalFusionTransformer` (field names of the Rust original).

    Parameters
    ----------
    num_static_features : int
        m_s >= 1, static (time-invariant) real inputs.
    num_known_features : int
        m_x >= 1, known-future inputs (the decoder's inputs, ``future``).
    num_unknown_features : int
        m_z >= 1, observed-past inputs (the encoder's inputs, ``historical``).
    hidden_dim : int
        d, the width of every layer; must be divisible by ``num_heads``.
    sequence_length : int
        k >= 1, encoder steps.
    prediction_horizon : int
        tau >= 1, decoder steps.
    quantiles : tuple of float, default (0.1, 0.5, 0.9)
        Strictly increasing, in (0, 1).
    num_heads : int, default 4
        H, attention heads of :class:`~nbqat.nn.InterpretableMultiHeadAttention`.
    dropout : float, default 0.0
        Drop probability in [0, 1) of the :class:`~nbqat.nn.Dropout` at every GLU's input (the
        TFT paper's placement); active only in training mode (:func:`nbqat.nn.set_dropout`).
    linear_skip : bool, default False
        Add a linear skip from the whole flattened window to the output (TiDE / DLinear-style
        hybrid): :attr:`TemporalFusionTransformer.linear_skip`, a :class:`~nbqat.nn.Linear`
        ``(k_s m_z + tau m_x + m_s) -> tau Q`` on ``concat([historical[:, -k_s:].reshape(B,
        -1), future.reshape(B, -1), static], axis=1)``, reshaped (B, tau, Q) and added to the
        output layer's output.
    skip_sequence_length : int or None, default None
        k_s >= 1, the encoder steps the linear skip reads (needs ``linear_skip``); None: k.
        The ``historical`` input then has ``max(k, k_s)`` steps
        (:attr:`input_length`): the network body reads its last k, the skip its last k_s, so
        a linear model of a longer history (a week of half-hours) can sit beside a body of a
        shorter one.

    Attributes
    ----------
    num_quantiles : int
        ``len(quantiles)`` (Q).
    input_dim : int
        ``m_s + m_x + m_z``.
    skip_steps : int
        k_s (``skip_sequence_length``, or k when None).
    input_length : int
        ``max(k, k_s)``, the steps of ``historical``.

    Raises
    ------
    ValueError
        On a non-positive size, ``hidden_dim % num_heads != 0``, bad quantiles, a dropout
        outside [0, 1), or a ``skip_sequence_length`` without ``linear_skip``.
    """

    num_heads: int = 4
    dropout: float = 0.0
    linear_skip: bool = False
    skip_sequence_length: int | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        check_positive_int_fields(self, ("num_heads",))
        if self.hidden_dim % self.num_heads != 0:
            raise ValueError(
                f"TFTConfig.hidden_dim ({self.hidden_dim}) must be divisible by num_heads "
                f"({self.num_heads})"
            )
        if not 0.0 <= float(self.dropout) < 1.0:
            raise ValueError(f"TFTConfig.dropout must be in [0, 1), got {self.dropout!r}")
        self.dropout = float(self.dropout)
        if not isinstance(self.linear_skip, (bool, np.bool_)):
            raise TypeError(f"TFTConfig.linear_skip must be a bool, got {self.linear_skip!r}")
        self.linear_skip = bool(self.linear_skip)
        if self.skip_sequence_length is not None:
            check_positive_int_fields(self, ("skip_sequence_length",))
            if not self.linear_skip:
                raise ValueError(
                    "TFTConfig.skip_sequence_length sets the linear skip's history, but "
                    "linear_skip is False: set linear_skip=True or skip_sequence_length=None"
                )

    @property
    def skip_steps(self) -> int:
        return (
            self.sequence_length if self.skip_sequence_length is None else self.skip_sequence_length
        )

    @property
    def input_length(self) -> int:
        return max(self.sequence_length, self.skip_steps)

    @property
    def input_dim(self) -> int:
        return self.num_static_features + self.num_known_features + self.num_unknown_features

    @property
    def window_features(self) -> int:
        """``k_s m_z + tau m_x + m_s``: the flattened window (the linear skip's input size)."""
        return (
            self.skip_steps * self.num_unknown_features
            + self.prediction_horizon * self.num_known_features
            + self.num_static_features
        )


class TemporalFusionTransformer(BufferedModel):
    """TFT-like quantile forecaster (Lim et al. 2021) with a hand-written backward pass.

    Parameters
    ----------
    config : TFTConfig
        The sizes (features, hidden width, sequence length, horizon, quantiles, heads).
    seed : int, default 0
        Seed of the initial weights (drawn in float64, then cast).
    dtype : numpy dtype, default numpy.float32
        float32 or float64: the dtype of the parameters, of every computation and of the
        outputs (inputs are cast to it).

    Raises
    ------
    TypeError
        When ``config`` is not a :class:`TFTConfig`.
    ValueError
        When ``dtype`` is neither float32 nor float64.

    Attributes
    ----------
    params, grads : ndarray (P,)
        The flat parameter and gradient buffers (same layout); every layer's parameters are
        views into them (``named_parameters()``).
    attention_weights : ndarray (B, tau, T) or None
        After forward: attention probabilities averaged over heads (T = k + tau).
    static_weights, encoder_weights, decoder_weights : ndarray or None
        After forward: variable-selection weights (B, m_s), (B, k, m_z), (B, tau, m_x). These
        four are read-only views of arrays backward reads (copy them to edit).
    output_head : str
        ``"output_layer"``: the quantile head, kept in float by :func:`~nbqat.nn.prepare_qat`
        unless ``QATConfig.quantize_output_head`` (the linear skip, which also writes the
        output, is float unless ``QATConfig.quantize_linear_skip``).

    Notes
    -----
    Data flow (B batch, k = sequence_length, tau = prediction_horizon, T = k + tau, d hidden):

    1-4. ``static_vsn`` (no context) -> xi_s (B, d); four context GRNs ``static_context_*``
       give c_s (selection), c_e (enrichment), c_h, c_c (LSTM initial state).
       ``encoder_vsn(historical, c_s)`` -> (B, k, d), ``decoder_vsn(future, c_s)`` -> (B, tau, d);
       the encoder sees only the observed inputs, the decoder only the known inputs.
    5-6. ``lstm_encoder`` from (c_h, c_c); ``lstm_decoder`` from the encoder's final (h, c);
       ``phi = post_lstm_gate(lstm_out, vsn_out)`` = LayerNorm(vsn_out + GLU(lstm_out)), one
       gate shared by encoder and decoder steps.
    7. ``theta = static_enrichment(phi, c_e)`` on all T steps.
    8. ``multihead_attn``: queries = decoder steps of theta, keys/values = all T steps of theta,
       a decoder step sees the encoder, the earlier decoder steps AND ITSELF.
    9. ``delta = post_attn_gate(attn, theta_dec)``, ``psi = pos_wise_ff(delta)``,
       ``psi~ = pre_output_gate(psi, phi_dec)``.
    10. ``output_layer`` Linear(d -> Q) on the tau decoder steps.
    11. With ``config.linear_skip``: ``out += linear_skip(concat([historical[:, -k_s:]
        .reshape(B, -1), future.reshape(B, -1), static], axis=1)).reshape(B, tau, Q)`` (a
        Linear ``k_s m_z + tau m_x + m_s -> tau Q``; QAT quantizes it like every Linear).
        ``historical`` has ``max(k, k_s)`` steps; steps 1-10 read its last k.

    Choices where references differ: dropout only at the GLU inputs (``config.dropout``, in
    training mode, see :func:`~nbqat.nn.set_dropout`; none in the attention); GRN skip is a Linear
    when sizes differ; every Linear has a bias except the GRN context projections; LSTM keeps
    torch's two biases; LayerNorm eps 1e-5; the GLU is one Linear (d -> 2d) split value/gate.

    Float path: the variable-selection embeddings are folded into the first projections and each
    GRN's ``fc2`` into its GLU's projection (same function, float rounding in another order;
    :meth:`~nbqat.nn.params.Module.set_folding` turns both off; QAT never folds).
    """

    output_head = "output_layer"

    def __init__(self, config: TFTConfig, seed: int = 0, dtype: Any = np.float32) -> None:
        super().__init__()
        if not isinstance(config, TFTConfig):
            raise TypeError(f"config must be a TFTConfig, got {type(config)}")
        dt = np.dtype(dtype)
        if dt not in (np.dtype(np.float32), np.dtype(np.float64)):
            raise ValueError(f"dtype must be np.float32 or np.float64, got {dt}")
        cfg = config
        d = cfg.hidden_dim
        self.config = cfg
        self.static_vsn = layers.VariableSelectionNetwork(cfg.num_static_features, d)
        self.static_context_variable_selection = layers.GatedResidualNetwork(d, d, d)
        self.static_context_enrichment = layers.GatedResidualNetwork(d, d, d)
        self.static_context_initial_hidden = layers.GatedResidualNetwork(d, d, d)
        self.static_context_initial_cell = layers.GatedResidualNetwork(d, d, d)
        self.encoder_vsn = layers.VariableSelectionNetwork(cfg.num_unknown_features, d, d)
        self.decoder_vsn = layers.VariableSelectionNetwork(cfg.num_known_features, d, d)
        self.lstm_encoder = layers.LSTM(d, d)
        self.lstm_decoder = layers.LSTM(d, d)
        self.post_lstm_gate = layers.GateAddNorm(d, d)
        self.static_enrichment = layers.GatedResidualNetwork(d, d, d, d)
        self.multihead_attn = layers.InterpretableMultiHeadAttention(d, cfg.num_heads)
        self.post_attn_gate = layers.GateAddNorm(d, d)
        self.pos_wise_ff = layers.GatedResidualNetwork(d, d, d)
        self.pre_output_gate = layers.GateAddNorm(d, d)
        self.output_layer = layers.Linear(d, cfg.num_quantiles)
        self.linear_skip: layers.Linear | None = None
        if cfg.linear_skip:
            self.linear_skip = layers.Linear(
                cfg.window_features, cfg.prediction_horizon * cfg.num_quantiles
            )
        if cfg.dropout > 0:  # one Dropout at every GLU's input (ParameterBuffer numbers them)
            for glu in [m for m in self.modules() if isinstance(m, layers.GatedLinearUnit)]:
                glu.dropout = layers.Dropout(cfg.dropout)
        self.buffer = ParameterBuffer(self, dt, seed)
        self.dtype = dt
        self._contexts: GRNStack | None = None  # the static-context GRNs as one stack
        self._contexts_stacked = False  # whether the last forward ran them stacked
        self.attention_weights: np.ndarray | None = None
        self.static_weights: np.ndarray | None = None
        self.encoder_weights: np.ndarray | None = None
        self.decoder_weights: np.ndarray | None = None

    # -- forward / backward ----------------------------------------------------------------
    def forward(self, static: np.ndarray, historical: np.ndarray, future: np.ndarray) -> np.ndarray:
        """Quantile forecasts.

        Parameters
        ----------
        static : ndarray (B, num_static_features)
            Static (time-invariant) inputs, float32 or float64 (cast to the model's dtype).
        historical : ndarray (B, input_length, num_unknown_features)
            Observed past inputs (float32 or float64): the last k steps feed the encoder,
            the last k_s the linear skip (``input_length = max(k, k_s)``, k without
            ``skip_sequence_length``).
        future : ndarray (B, prediction_horizon, num_known_features)
            Known future inputs of the tau decoder steps (float32 or float64).

        Returns
        -------
        ndarray (B, prediction_horizon, num_quantiles)
            The forecast quantiles, in the model's dtype. The attention and variable-selection
            weights of this batch are set as attributes.

        Raises
        ------
        ValueError
            When an input is not a float32/float64 NumPy array of the expected shape, or the
            batch sizes differ.
        """
        cfg = self.config
        static, historical, future = check_forecast_inputs(
            cfg, static, historical, future, self.dtype
        )
        k, n_in, nb = cfg.sequence_length, cfg.input_length, static.shape[0]
        xi_s, self.static_weights = self.static_vsn.forward(static)  # (B, d), (B, m_s)
        contexts = self._contexts = GRNStack.of(
            [self.static_context_variable_selection, self.static_context_enrichment,
             self.static_context_initial_hidden, self.static_context_initial_cell],
            self._contexts,
        )  # fmt: skip
        if contexts is not None:  # the four GRNs in one batched pass (the same bits)
            c_s, c_e, c_h, c_c = contexts.forward_shared(xi_s)  # (B, d) each
        else:
            c_s = self.static_context_variable_selection.forward(xi_s)  # (B, d)
            c_e = self.static_context_enrichment.forward(xi_s)  # (B, d)
            c_h = self.static_context_initial_hidden.forward(xi_s)  # (B, d)
            c_c = self.static_context_initial_cell.forward(xi_s)  # (B, d)
        self._contexts_stacked = contexts is not None
        hist_enc = historical if n_in == k else np.ascontiguousarray(historical[:, n_in - k :])
        e_enc, self.encoder_weights = self.encoder_vsn.forward(hist_enc, c_s)  # (B, k, d)
        e_dec, self.decoder_weights = self.decoder_vsn.forward(future, c_s)  # (B, tau, d)
        h_enc, (h_k, c_k) = self.lstm_encoder.forward(e_enc, c_h, c_c)  # (B, k, d)
        h_dec, _ = self.lstm_decoder.forward(e_dec, h_k, c_k)  # (B, tau, d)
        lstm_out = np.concatenate([h_enc, h_dec], axis=1)  # (B, T, d)
        emb = np.concatenate([e_enc, e_dec], axis=1)  # (B, T, d)
        phi = self.post_lstm_gate.forward(lstm_out, emb)  # (B, T, d)
        theta = self.static_enrichment.forward(phi, c_e)  # (B, T, d)
        theta_dec = np.ascontiguousarray(theta[:, k:])  # (B, tau, d)
        attn = self.multihead_attn.forward(theta_dec, theta, offset=k)  # (B, tau, d)
        delta = self.post_attn_gate.forward(attn, theta_dec)  # (B, tau, d)
        psi = self.pos_wise_ff.forward(delta)  # (B, tau, d)
        phi_dec = np.ascontiguousarray(phi[:, k:])  # (B, tau, d)
        psi_t = self.pre_output_gate.forward(psi, phi_dec)  # (B, tau, d)
        out = self.output_layer.forward(psi_t)  # (B, tau, Q)
        if self.linear_skip is not None:
            hist_skip = historical[:, n_in - cfg.skip_steps :]  # (B, k_s, m_z)
            x = np.concatenate(
                [hist_skip.reshape(nb, -1), future.reshape(nb, -1), static], axis=1
            )  # (B, k_s m_z + tau m_x + m_s)
            out = out + self.linear_skip.forward(x).reshape(out.shape)
        self.attention_weights = self.multihead_attn.attention_weights  # (B, tau, T)
        self._cache = out.shape
        return out

    __call__ = forward

    @fill_doc(backward_io=BACKWARD_IO.format(cast="; cast to the model's dtype"))
    def backward(self, grad_out: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Backpropagate ``grad_out`` (B, tau, Q), accumulating into :attr:`grads`.

        {backward_io}

        Raises
        ------
        RuntimeError
            Before any forward.
        ValueError
            When ``grad_out`` does not have the last forward's output shape.
        """
        g = check_grad_out(grad_out, self._require_forward(), self.dtype)
        k = self.config.sequence_length
        dpsi_t = self.output_layer.backward(g)  # (B, tau, d)
        dpsi, dphi_dec = self.pre_output_gate.backward(dpsi_t)
        ddelta, _ = self.pos_wise_ff.backward(dpsi)
        dattn, dtheta_dec = self.post_attn_gate.backward(ddelta)
        dq, dtheta = self.multihead_attn.backward(dattn)  # (B, tau, d), (B, T, d)
        dtheta[:, k:] += dq  # fan-out of theta_dec: query path ...
        dtheta[:, k:] += dtheta_dec  # ... and the post-attention skip
        dphi, dc_e = self.static_enrichment.backward(dtheta)  # (B, T, d), (B, d)
        dphi[:, k:] += dphi_dec  # phi_dec also feeds the pre-output skip
        dlstm, demb = self.post_lstm_gate.backward(dphi)  # (B, T, d) x2
        de_dec, dh_k, dc_k = self.lstm_decoder.backward(np.ascontiguousarray(dlstm[:, k:]))
        # the decoder's initial-state gradient seeds the encoder's last step
        de_enc, dc_h, dc_c = self.lstm_encoder.backward(
            np.ascontiguousarray(dlstm[:, :k]), dh_k, dc_k
        )
        de_enc += demb[:, :k]
        de_dec += demb[:, k:]
        dfuture, dc_s1 = self.decoder_vsn.backward(de_dec)
        dhist, dc_s2 = self.encoder_vsn.backward(de_enc)  # (B, k, m_z)
        cfg = self.config
        n_in = cfg.input_length
        if n_in != k:  # the encoder read the last k of the n_in historical steps
            full = np.zeros((dhist.shape[0], n_in, dhist.shape[2]), dhist.dtype)
            full[:, n_in - k :] = dhist
            dhist = full
        assert dc_s1 is not None and dc_s2 is not None and dc_e is not None
        dc_s = dc_s1 + dc_s2  # c_s is read by both temporal VSNs
        # xi_s fans out into the four static-context GRNs: add their gradients
        if self._contexts_stacked:
            assert self._contexts is not None
            da = self._contexts.backward_shared(np.stack([dc_s, dc_e, dc_h, dc_c]))
            dxi_s = da[0].copy()
            dxi_s += da[1]
            dxi_s += da[2]
            dxi_s += da[3]
        else:
            dxi_s = self.static_context_variable_selection.backward(dc_s)[0]
            dxi_s += self.static_context_enrichment.backward(dc_e)[0]
            dxi_s += self.static_context_initial_hidden.backward(dc_h)[0]
            dxi_s += self.static_context_initial_cell.backward(dc_c)[0]
        dstatic, _ = self.static_vsn.backward(dxi_s)
        if self.linear_skip is not None:
            nb = g.shape[0]
            dx = self.linear_skip.backward(g.reshape(nb, -1))  # (B, F)
            k_s = cfg.skip_steps
            n_h = k_s * cfg.num_unknown_features
            n_f = cfg.prediction_horizon * cfg.num_known_features
            dhist[:, n_in - k_s :] += dx[:, :n_h].reshape(nb, k_s, -1)
            dfuture += dx[:, n_h : n_h + n_f].reshape(dfuture.shape)
            dstatic += dx[:, n_h + n_f :]
        return dstatic, dhist, dfuture
