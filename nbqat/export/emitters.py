"""One ONNX emitter per nbqat layer type: the one registry of every exported model.

An emitter has the signature ``emit(g, name, module, *inputs, **options) -> outputs`` where
``g`` is the :class:`~nbqat.export._graph.GraphBuilder`, ``name`` the module's dotted name in
the model (it names the nodes) and the inputs/outputs are ONNX tensor names. :func:`emit`
dispatches on the module's type through :data:`EMITTERS`; supporting a new layer is one more
function registered there. The integer model of either forecaster (``to_int8()`` /
:func:`nbqat.nn.convert`) holds :class:`~nbqat.nn.QuantizedLinear` /
:class:`~nbqat.nn.QuantizedLSTM` modules where the QAT model quantized, so the float layer types
emit float operators and the integer ones a QuantizeLinear -> DequantizeLinear pair at every
point where the QAT model fake-quantizes (int8, grouped int4 and float8 weights:
:mod:`nbqat.export.lowbit`). Each emitter follows the float arithmetic of the nbqat layer it
mirrors (the order of additions included). The forecasters' own data flow (the TFT's,
:class:`~nbqat.nn.LSTMForecaster`'s) are emitters of their types too.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from nbqat.export import lowbit
from nbqat.export._graph import GraphBuilder, QParams
from nbqat.nn import layers
from nbqat.nn.convert import QuantizedLinear, QuantizedLSTM
from nbqat.nn.int8_layers import Int8Linear
from nbqat.nn.lstm_forecaster import LSTMForecaster
from nbqat.nn.sequential import Sequential

Emitter = Callable[..., Any]
#: The emitter of each layer type (exact type match first, then ``isinstance``).
EMITTERS: dict[type, Emitter] = {}


def register(cls: type) -> Callable[[Emitter], Emitter]:
    """Decorator: register ``fn`` as the emitter of the layer type ``cls``."""

    def deco(fn: Emitter) -> Emitter:
        EMITTERS[cls] = fn
        return fn

    return deco


def emit(g: GraphBuilder, name: str, module: Any, *inputs: Any, **options: Any) -> Any:
    """Emit ``module`` (dispatch on its type).

    Raises
    ------
    TypeError
        For a layer type without an emitter.
    """
    fn = EMITTERS.get(type(module))
    if fn is None:
        for cls, f in EMITTERS.items():
            if isinstance(module, cls):
                fn = f
                break
    if fn is None:
        raise TypeError(
            f"no ONNX emitter for layer {name!r} of type {type(module).__name__}: register one "
            "with nbqat.export.emitters.register"
        )
    return fn(g, name, module, *inputs, **options)


def _input_qparams(lin: Any, name: str) -> QParams:
    return QParams(
        name,
        np.float32(lin.input_scale),
        int(lin.input_zero_point),
        int(lin.input_quant_min),
        int(lin.input_quant_max),
    )


def _quant_in(g: GraphBuilder, x: str, lin: Any, qname: str, hint: str) -> str:
    """``DQ(Q(x))`` with an ``Int8Linear``'s input qparams; a low-bit layer's input
    quantization (per token, float8, none) from :func:`nbqat.export.lowbit.quantize_input`."""
    if type(lin) is Int8Linear:
        return g.qdq(x, _input_qparams(lin, qname), hint)
    return lowbit.quantize_input(g, x, lin, qname, hint)


def weight_dq(g: GraphBuilder, lin: Any, hint: str) -> str:
    """The (K, N) float weight of an integer layer: int8 codes + per-axis DequantizeLinear
    (:meth:`GraphBuilder.weight_dq <nbqat.export._graph.GraphBuilder.weight_dq>`), a low-bit
    layer's (grouped int4, float8) from :func:`nbqat.export.lowbit.weight_dq`."""
    if type(lin) is Int8Linear:
        return g.weight_dq(lin, hint)
    return lowbit.weight_dq(g, lin, hint)


def qlinear(g: GraphBuilder, name: str, lin: Any, x: str, bias: Any = None) -> str:
    """The quantized matmul of an ``Int8Linear`` (or a low-bit twin):
    ``DQ(Q(x)) @ DQ(W_q)`` [+ ``bias``]."""
    xq = _quant_in(g, x, lin, name + ".input_fake_quant", name + ".input")
    y = g.node("MatMul", [xq, weight_dq(g, lin, name)], name)
    if bias is not None:
        y = g.node("Add", [y, g.init(name + ".bias", np.asarray(bias, np.float32))], name)
    return y


@register(layers.Linear)
def emit_linear(
    g: GraphBuilder, name: str, mod: layers.Linear, x: str, add_bias: bool = True
) -> str:
    """A float layer (the quantile head by default): ``x @ W.T + b`` over the last axis."""
    with_bias = mod.has_bias and add_bias
    w = g.init(name + ".weight", np.asarray(mod.weight, np.float32).T)
    y = g.node("MatMul", [x, w], name)
    if with_bias:
        y = g.node("Add", [y, g.init(name + ".bias", np.asarray(mod.bias, np.float32))], name)
    return y


@register(QuantizedLinear)
def emit_quantized_linear(
    g: GraphBuilder, name: str, mod: QuantizedLinear, x: str, add_bias: bool = True
) -> str:
    """A converted Linear: ``DQ(Q(x)) @ DQ(W_q)`` (+ b when the layer has a bias)."""
    lin = mod.int8
    return qlinear(g, name, lin, x, lin.bias if mod.has_bias and add_bias else None)


def _child(name: str, key: str) -> str:
    """The dotted name of child ``key`` of the module named ``name`` (``""``: the model)."""
    return f"{name}.{key}" if name else key


@register(Sequential)
def emit_sequential(g: GraphBuilder, name: str, mod: Sequential, x: str) -> str:
    """Each layer on the previous one's output, named ``"0"``, ``"1"``, ... like its modules."""
    for i, layer in enumerate(mod):
        x = emit(g, _child(name, str(i)), layer, x)
    return x


@register(layers.ELU)
def emit_elu(g: GraphBuilder, name: str, mod: layers.ELU, x: str) -> str:
    """``Elu`` (alpha 1, torch's and nbqat's)."""
    return g.node("Elu", [x], name or "elu", alpha=1.0)


@register(layers.Dropout)
def emit_dropout(g: GraphBuilder, name: str, mod: layers.Dropout, x: str) -> str:
    """The identity: the exported model is the int8 inference model, where dropout is off."""
    return x


@register(layers.LayerNorm)
def emit_layernorm(g: GraphBuilder, name: str, mod: layers.LayerNorm, x: str) -> str:
    """LayerNormalization (opset >= 17) or its two-pass decomposition (opset 13-16)."""
    w = g.init(name + ".weight", np.asarray(mod.weight, np.float32))
    b = g.init(name + ".bias", np.asarray(mod.bias, np.float32))
    if g.opset >= 17:
        return g.node("LayerNormalization", [x, w, b], name, axis=-1, epsilon=float(mod.eps))
    mean = g.node("ReduceMean", [x], name, axes=[-1], keepdims=1)
    d = g.node("Sub", [x, mean], name)
    var = g.node("ReduceMean", [g.node("Mul", [d, d], name)], name, axes=[-1], keepdims=1)
    rstd = g.node(
        "Reciprocal",
        [g.node("Sqrt", [g.node("Add", [var, g.const(np.float32(mod.eps))], name)], name)],
        name,
    )
    y = g.node("Mul", [g.node("Mul", [d, rstd], name), w], name)
    return g.node("Add", [y, b], name)


@register(layers.GatedLinearUnit)
def emit_glu(
    g: GraphBuilder, name: str, mod: layers.GatedLinearUnit, x: str, residual: str | None = None
) -> str:
    """``value * sigmoid(gate)`` [+ residual] of one Linear (value columns first)."""
    z = emit(g, name + ".fc", mod.fc, x)
    c = mod.output_size
    val, gate = g.node("Split", [z, g.const([c, c], np.int64)], name, n_out=2, axis=-1)
    y = g.node("Mul", [val, g.node("Sigmoid", [gate], name)], name)
    return y if residual is None else g.node("Add", [y, residual], name)


@register(layers.GateAddNorm)
def emit_gate_add_norm(
    g: GraphBuilder, name: str, mod: layers.GateAddNorm, x: str, skip: str
) -> str:
    """``LayerNorm(skip + GLU(x))``."""
    return emit(g, name + ".norm", mod.norm, emit(g, name + ".glu", mod.glu, x, skip))


@register(layers.GatedResidualNetwork)
def emit_grn(
    g: GraphBuilder,
    name: str,
    mod: layers.GatedResidualNetwork,
    a: str,
    c: str | None = None,
    rank: int = 2,
) -> str:
    """``LayerNorm(skip(a) + GLU(fc2(ELU(fc1(a) + context(c)))))``; ``rank`` is ``a``'s rank
    (a 2-D context is broadcast over the time axis of a 3-D ``a``)."""
    z = emit(g, name + ".fc1", mod.fc1, a, add_bias=False)
    z = g.node("Add", [z, g.init(name + ".fc1.bias", _bias(g, name + ".fc1", mod.fc1))], name)
    if c is not None:
        cp = emit(g, name + ".context", mod.context, c)
        if rank == 3:
            cp = g.unsqueeze(cp, 1, name)
        z = g.node("Add", [z, cp], name)
    eta2 = g.node("Elu", [z], name, alpha=1.0)
    eta1 = emit(g, name + ".fc2", mod.fc2, eta2)
    skip = emit(g, name + ".skip", mod.skip, a) if mod.input_size != mod.output_size else a
    return emit(g, name + ".gate", mod.gate, eta1, skip)


def _bias(g: GraphBuilder, name: str, mod: Any) -> np.ndarray:
    """The float32 bias of a Linear or a QuantizedLinear (the int8 layer's copy)."""
    return np.asarray(mod.bias, np.float32)


@register(layers.VariableSelectionNetwork)
def emit_vsn(
    g: GraphBuilder,
    name: str,
    mod: layers.VariableSelectionNetwork,
    x: str,
    c: str | None = None,
    rank: int = 2,
) -> tuple[str, str]:
    """Embedding ``x_j w_j + b_j``, selection weights ``softmax(flat_grn(flat, c))``, per-variable
    GRNs and the weighted sum ``sum_j v_j xi~_j`` (j in order, as nbqat sums). Returns
    ``(output, weights)``."""
    m, d = mod.num_vars, mod.hidden_size
    e = mod.embedding
    w = g.init(name + ".embedding.weight", np.asarray(e.weight, np.float32))
    b = g.init(name + ".embedding.bias", np.asarray(e.bias, np.float32))
    emb = g.node("Mul", [g.unsqueeze(x, -1, name), w], name)  # (..., m, d)
    emb = g.node("Add", [emb, b], name)
    flat = g.reshape(emb, [0] * (rank - 1) + [m * d], name)  # (..., m*d)
    logits = emit(g, name + ".flat_grn", mod.flat_grn, flat, c, rank=rank)
    v = g.node("Softmax", [logits], name, axis=-1)  # (..., m)
    out = None
    for j, grn in enumerate(mod.var_grns):
        xj = g.gather(emb, j, rank - 1, name)  # (..., d)
        xs = emit(g, f"{name}.var_grns.{j}", grn, xj, rank=rank)
        vj = g.unsqueeze(g.gather(v, j, rank - 1, name), -1, name)
        term = g.node("Mul", [vj, xs], name)
        out = term if out is None else g.node("Add", [out, term], name)
    return out, v  # type: ignore[return-value]


@register(layers.LSTM)
def emit_lstm(
    g: GraphBuilder, name: str, mod: layers.LSTM, x: str, h0: str, c0: str, steps: int
) -> tuple[str, str, str]:
    """A float LSTM UNROLLED over its ``steps`` (:func:`_unrolled_lstm`). Returns
    ``(out (B, L, d), h_L, c_L)``."""
    w_ih = g.init(name + ".weight_ih", np.asarray(mod.weight_ih, np.float32).T)
    w_hh = g.init(name + ".weight_hh", np.asarray(mod.weight_hh, np.float32).T)
    bias = np.asarray(mod.bias_ih + mod.bias_hh, np.float32)
    return _unrolled_lstm(g, name, mod.hidden_size, x, (w_ih, w_hh, bias, None), h0, c0, steps)


@register(QuantizedLSTM)
def emit_quantized_lstm(
    g: GraphBuilder, name: str, mod: QuantizedLSTM, x: str, h0: str, c0: str, steps: int
) -> tuple[str, str, str]:
    """A converted LSTM unrolled: the input projection of all steps is one MatMul (input
    quantized once, as in training), and at every step ``h_{t-1}`` goes through the
    hidden-state Q/DQ before ``W_hh``, exactly where training's ``hidden_fake_quant`` sits."""
    lstm = mod.int8
    xq = _quant_in(g, x, lstm.ih, name + ".input_fake_quant", name + ".input")
    w_ih = weight_dq(g, lstm.ih, name + ".ih")
    w_hh = weight_dq(g, lstm.hh, name + ".hh")
    bias = np.asarray(lstm.ih.bias, np.float32)
    return _unrolled_lstm(g, name, mod.hidden_size, xq, (w_ih, w_hh, bias, lstm.hh), h0, c0, steps)


def _unrolled_lstm(
    g: GraphBuilder, name: str, d: int, xq: str, w: tuple, h0: str, c0: str, steps: int
) -> tuple[str, str, str]:
    """The LSTM over its ``steps`` (fixed by the model's config) from the (fake-quantized)
    input ``xq`` and ``w = (W_ih (K, 4d), W_hh (d, 4d), bias, hidden layer or None)``."""
    w_ih, w_hh, bias, hqp = w
    xg = g.node("MatMul", [xq, w_ih], name)  # (B, L, 4d)
    xg = g.node("Add", [xg, g.init(name + ".bias", bias)], name)
    split = g.const([d, d, d, d], np.int64)
    h, c = h0, c0
    hs = []
    for t in range(steps):
        hint = f"{name}.step{t}"
        hq = (
            h
            if hqp is None
            else _quant_in(g, h, hqp, name + ".hidden_fake_quant", hint + ".hidden")
        )
        a = g.node("Add", [g.gather(xg, t, 1, hint), g.node("MatMul", [hq, w_hh], hint)], hint)
        i, f, gg, o = g.node("Split", [a, split], hint, n_out=4, axis=-1)
        i, f, o = (g.node("Sigmoid", [v], hint) for v in (i, f, o))
        gg = g.node("Tanh", [gg], hint)
        c = g.node("Add", [g.node("Mul", [f, c], hint), g.node("Mul", [i, gg], hint)], hint)
        h = g.node("Mul", [o, g.node("Tanh", [c], hint)], hint)
        hs.append(g.unsqueeze(h, 1, hint))
    out = hs[0] if steps == 1 else g.node("Concat", hs, name, axis=1)
    return out, h, c


@register(layers.InterpretableMultiHeadAttention)
def emit_attention(
    g: GraphBuilder,
    name: str,
    mod: layers.InterpretableMultiHeadAttention,
    query: str,
    key_value: str,
    offset: int,
    tq: int,
    tk: int,
) -> str:
    """``out_proj((1/H) sum_h softmax(Q_h K_h^T / sqrt(d_h) + M) V)``; the mask ``M`` (0 or
    -inf: query i sees keys ``j <= offset + i``) is a constant of the fixed sequence lengths;
    the probabilities get the attention Q/DQ when training had it."""
    nh, dh = mod.n_head, mod.d_head
    q = emit(g, name + ".q_proj", mod.q_proj, query)  # (B, tq, d)
    k = emit(g, name + ".k_proj", mod.k_proj, key_value)  # (B, T, d)
    v = emit(g, name + ".v_proj", mod.v_proj, key_value)  # (B, T, d_h)
    qh = g.node("Transpose", [g.reshape(q, [0, 0, nh, dh], name)], name, perm=[0, 2, 1, 3])
    kt = g.node("Transpose", [g.reshape(k, [0, 0, nh, dh], name)], name, perm=[0, 2, 3, 1])
    s = g.node("MatMul", [qh, kt], name)  # (B, H, tq, T)
    s = g.node("Div", [s, g.const(np.sqrt(np.float32(dh)))], name)
    mask = np.where(
        np.arange(tk)[None, :] <= offset + np.arange(tq)[:, None], np.float32(0), -np.inf
    ).astype(np.float32)
    s = g.node("Add", [s, g.init(name + ".mask", mask)], name)
    p = g.node("Softmax", [s], name, axis=-1)
    afq = getattr(mod, "attention_fake_quant", None)
    if afq is not None:
        qp = QParams(
            name + ".attention_fake_quant",
            np.float32(afq.scale),
            int(afq.zero_point),
            int(afq.quant_min),
            int(afq.quant_max),
        )
        p = g.qdq(p, qp, name + ".probs")
    pbar = g.node("ReduceSum", [p, g.const([1], np.int64)], name, keepdims=0)  # (B, tq, T)
    pbar = g.node("Mul", [pbar, g.const(np.float32(1) / np.float32(nh))], name)
    o = g.node("MatMul", [pbar, v], name)  # (B, tq, d_h)
    return emit(g, name + ".out_proj", mod.out_proj, o)


def _zeros(g: GraphBuilder, like: str, width: int, hint: str) -> str:
    """A float32 (B, width) zero tensor, B the batch of ``like``."""
    from onnx import TensorProto, helper

    batch = g.node(
        "Slice",
        [
            g.node("Shape", [like], hint),
            g.const([0], np.int64),
            g.const([1], np.int64),
        ],
        hint,
    )
    shape = g.node("Concat", [batch, g.const([width], np.int64)], hint, axis=0)
    zero = helper.make_tensor("value", TensorProto.FLOAT, [1], [0.0])
    return g.node("ConstantOfShape", [shape], hint, value=zero)


@register(LSTMForecaster)
def emit_lstm_forecaster(
    g: GraphBuilder, name: str, m: LSTMForecaster, static: str, hist: str, fut: str
) -> str:
    """LSTM encoder from a zero state; its final ``h_k`` and the static inputs repeated over
    the tau steps, concatenated with the known inputs, -> ``fc`` -> ELU -> ``head``."""
    cfg = m.config
    d, tau = cfg.hidden_dim, cfg.prediction_horizon
    zeros = _zeros(g, static, d, "state0")
    _, h_k, _ = emit(g, "encoder", m.encoder, hist, zeros, zeros, cfg.sequence_length)
    rep = g.const([1, tau, 1], np.int64)
    hk = g.node("Expand", [g.unsqueeze(h_k, 1, "z"), rep], "z")
    sx = g.node("Expand", [g.unsqueeze(static, 1, "z"), rep], "z")
    z = g.node("Concat", [hk, fut, sx], "z", axis=2)
    y = g.node("Elu", [emit(g, "fc", m.fc, z)], "act", alpha=1.0)
    return emit(g, "head", m.head, y)
