"""``to_onnx``: the QAT forecaster as an ONNX QDQ graph (built with the ``onnx`` package)."""

from __future__ import annotations

import json
import os
import pathlib
from collections.abc import Mapping, Sequence
from types import SimpleNamespace
from typing import Any

import numpy as np

from nbqat import _validate as V
from nbqat._io import atomic_open
from nbqat.export._check import check_graph, check_int8, check_qat
from nbqat.export._graph import GraphBuilder, QParams
from nbqat.export.emitters import EMITTERS, emit, register
from nbqat.nn.tft import TemporalFusionTransformer

#: The opset written by default (int16/uint16 QDQ types exist from 21 on).
DEFAULT_OPSET = 21
#: The lowest opset supported: per-axis DequantizeLinear needs 13.
MIN_OPSET = 13
#: Graph input and output names.
INPUTS = ("static", "historical", "future")
#: The graph input and output of a model of one input (``to_onnx(..., input_shape=...)``).
INPUT, ONE_OUTPUT = "input", "output"
OUTPUT = "quantiles"


def as_int8(model: Any) -> Any:
    """An export view of a ``convert()`` result (``Int8Model``): the network, the integer
    layers by path, and no output quantizer (the attributes of an
    ``Int8TemporalFusionTransformer`` that the export reads)."""
    return SimpleNamespace(
        model=model.model,
        layers={n: getattr(m, "int8", m) for n, m in model.layers.items()},
        quantized_output=False,
        output_scale=None,
        output_zero_point=0,
        output_quant_min=0,
        output_quant_max=255,
        forward=model.forward,
    )


def _as_int8(model: Any) -> tuple[Any, str]:
    """The integer model to export and what it came from ("qat", "int8", "prepare_qat" or
    "convert")."""
    from nbqat.nn.convert import Int8Model, convert
    from nbqat.nn.int8_tft import Int8TemporalFusionTransformer
    from nbqat.nn.qat import QATTemporalFusionTransformer
    from nbqat.nn.quantize import QATModel

    if isinstance(model, QATTemporalFusionTransformer):
        check_qat(model)
        int8, source = model.to_int8(), "qat"
    elif isinstance(model, Int8TemporalFusionTransformer):
        int8, source = model, "int8"
    elif isinstance(model, QATModel):
        check_qat(model)
        int8, source = as_int8(convert(model)), "prepare_qat"
    elif isinstance(model, Int8Model):
        int8, source = as_int8(model), "convert"
    else:
        raise TypeError(
            "model must be a calibrated, frozen nbqat.nn.QATTemporalFusionTransformer or a "
            "model prepared by nbqat.nn.prepare_qat, or their integer model (to_int8() / "
            f"convert()), got {type(model).__name__}"
        )
    check_int8(int8)
    return int8, source


@register(TemporalFusionTransformer)
def emit_tft(g: GraphBuilder, name: str, tft: Any, static: str, hist: str, fut: str) -> str:
    """The forecaster's data flow (:meth:`TemporalFusionTransformer.forward`, steps 1-10),
    with the optional linear skip added to the head's output. Returns the (B, tau, Q) output
    before the network output quantizer."""
    cfg = tft.config
    k, tau, nq = cfg.sequence_length, cfg.prediction_horizon, cfg.num_quantiles
    n_in = cfg.input_length

    def last_steps(n: int, name: str) -> str:  # historical[:, n_in - n:]
        if n == n_in:
            return hist
        lo, hi = g.const([n_in - n], np.int64), g.const([n_in], np.int64)
        return g.node("Slice", [hist, lo, hi, g.const([1], np.int64)], name)

    xi_s, _ = emit(g, "static_vsn", tft.static_vsn, static)
    ctx = {
        n: emit(g, f"static_context_{n}", getattr(tft, f"static_context_{n}"), xi_s)
        for n in ("variable_selection", "enrichment", "initial_hidden", "initial_cell")
    }
    c_s = ctx["variable_selection"]
    e_enc, _ = emit(g, "encoder_vsn", tft.encoder_vsn, last_steps(k, "hist_enc"), c_s, rank=3)
    e_dec, _ = emit(g, "decoder_vsn", tft.decoder_vsn, fut, c_s, rank=3)
    h_enc, h_k, c_k = emit(
        g, "lstm_encoder", tft.lstm_encoder, e_enc, ctx["initial_hidden"], ctx["initial_cell"], k
    )
    h_dec, _, _ = emit(g, "lstm_decoder", tft.lstm_decoder, e_dec, h_k, c_k, tau)
    lstm_out = g.node("Concat", [h_enc, h_dec], "lstm_out", axis=1)  # (B, T, d)
    emb = g.node("Concat", [e_enc, e_dec], "emb", axis=1)
    phi = emit(g, "post_lstm_gate", tft.post_lstm_gate, lstm_out, emb)
    theta = emit(g, "static_enrichment", tft.static_enrichment, phi, ctx["enrichment"], rank=3)
    start, end, axis = g.const([k], np.int64), g.const([k + tau], np.int64), g.const([1], np.int64)
    theta_dec = g.node("Slice", [theta, start, end, axis], "theta_dec")
    attn = emit(g, "multihead_attn", tft.multihead_attn, theta_dec, theta, k, tau, k + tau)
    delta = emit(g, "post_attn_gate", tft.post_attn_gate, attn, theta_dec)
    psi = emit(g, "pos_wise_ff", tft.pos_wise_ff, delta, rank=3)
    phi_dec = g.node("Slice", [phi, start, end, axis], "phi_dec")
    psi_t = emit(g, "pre_output_gate", tft.pre_output_gate, psi, phi_dec)
    out = emit(g, "output_layer", tft.output_layer, psi_t)  # (B, tau, Q)
    if getattr(cfg, "linear_skip", False):  # sizes given: a (0, -1) reshape fails at batch 0
        flat = g.node(
            "Concat",
            [
                g.reshape(
                    last_steps(cfg.skip_steps, "hist_skip"),
                    [-1, cfg.skip_steps * cfg.num_unknown_features],
                    "skip",
                ),
                g.reshape(fut, [-1, tau * cfg.num_known_features], "skip"),
                static,
            ],
            "skip",
            axis=1,
        )
        skip = emit(g, "linear_skip", tft.linear_skip, flat)  # (B, tau * Q)
        out = g.node("Add", [out, g.reshape(skip, [0, tau, nq], "skip")], "linear_skip")
    return out


_CONFIG_FIELDS = (
    "num_static_features",
    "sequence_length",
    "num_unknown_features",
    "prediction_horizon",
    "num_known_features",
    "quantiles",
    "num_quantiles",
)


def _check_network(net: Any) -> None:
    """TypeError unless ``net`` is a forecaster (the graph's inputs static / historical /
    future come from its ``config``) whose type has an emitter."""
    cfg = getattr(net, "config", None)
    missing = [f for f in _CONFIG_FIELDS if not hasattr(cfg, f)]
    has_emitter = any(isinstance(net, cls) for cls in EMITTERS)
    if missing or not has_emitter:
        why = f"its config lacks {missing}" if missing else "its type has no ONNX emitter"
        raise TypeError(
            f"to_onnx exports forecasters (inputs static, historical, future; a config with "
            f"{', '.join(_CONFIG_FIELDS)}), got a network of type {type(net).__name__} ({why}): "
            "export a TemporalFusionTransformer or an LSTMForecaster, give a model of one input "
            "its input_shape (to_onnx(qat, path, input_shape=(6,)) for (B, 6) rows), or "
            "register an emitter for your forecaster type with nbqat.export.emitters.register"
        )


def build_model(
    model: Any,
    *,
    opset: int | None = None,
    metadata: Mapping[str, Any] | None = None,
    input_shape: Sequence[int] | None = None,
):
    """The ONNX ``ModelProto`` of ``model`` (see :func:`to_onnx`); nothing is written.

    Returns
    -------
    (onnx.ModelProto, GraphBuilder)
        The checked model and the builder (``quantize_inputs`` names every QuantizeLinear's
        float input, for :func:`nbqat.export.division_study`).
    """
    from onnx import TensorProto, helper

    from nbqat._version import __version__

    opset = _check_opset(opset)
    extra = _metadata_props(metadata)
    int8, source = _as_int8(model)
    g = GraphBuilder(opset, int8.layers)
    if input_shape is None:
        dims, out, out_dims, props = _forecaster_graph(g, int8)
    else:
        dims, out, out_dims, props = _one_input_graph(g, int8, input_shape)
    out_name = OUTPUT if input_shape is None else ONE_OUTPUT
    g.nodes.append(helper.make_node("Identity", [out], [out_name], name="output"))
    graph = helper.make_graph(
        g.nodes,
        "nbqat_tft_qdq" if input_shape is None else "nbqat_qdq",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, d) for n, d in dims.items()],
        [helper.make_tensor_value_info(out_name, TensorProto.FLOAT, out_dims)],
        initializer=g.initializers,
    )
    proto = helper.make_model(
        graph,
        producer_name="nbqat",
        producer_version=__version__,
        opset_imports=[helper.make_opsetid("", opset)],
    )
    proto.ir_version = min(proto.ir_version, _max_ir(opset))
    props = {
        "nbqat_version": __version__,
        "source": source,
        **props,
        "quantized_output": bool(int8.quantized_output),
        "inputs": {n: d[1:] for n, d in dims.items()},
    }
    if int8.output_scale is not None:
        props["output_scale"] = float(int8.output_scale)
        props["output_zero_point"] = int(int8.output_zero_point)
    props = {k: v if isinstance(v, str) else json.dumps(v) for k, v in props.items()}
    clash = sorted(set(extra) & set(props))
    if clash:
        raise ValueError(
            f"metadata {clash} would replace nbqat's own props ({sorted(props)}); rename them"
        )
    helper.set_model_props(proto, {**props, **extra})
    check_graph(proto, opset)
    return proto, g


def _forecaster_graph(g: GraphBuilder, int8: Any) -> tuple[dict, str, list, dict]:
    """A forecaster's graph: inputs static / historical / future from its config, the
    (B, tau, Q) quantiles out (through the output quantizer, if any)."""
    tft = int8.model
    _check_network(tft)
    cfg = tft.config
    dims: dict[str, list[Any]] = {
        "static": ["batch", cfg.num_static_features],
        "historical": ["batch", cfg.input_length, cfg.num_unknown_features],
        "future": ["batch", cfg.prediction_horizon, cfg.num_known_features],
    }
    for n in INPUTS:
        g.fresh(n)
    out = emit(g, "", tft, *INPUTS)
    if int8.quantized_output:
        qp = QParams(
            "output_fake_quant",
            np.float32(int8.output_scale),
            int(int8.output_zero_point),
            int(int8.output_quant_min),
            int(int8.output_quant_max),
        )
        out = g.qdq(out, qp, "output")
    out_dims = ["batch", cfg.prediction_horizon, cfg.num_quantiles]
    return dims, out, out_dims, {"quantiles": list(cfg.quantiles), "lstm": "unrolled"}


def _one_input_graph(g: GraphBuilder, int8: Any, input_shape: Any) -> tuple[dict, str, list, dict]:
    """A model of one input (a Sequential, a user's composite): the input ``INPUT`` of shape
    ``(batch, *input_shape)``; the output's shape is the int8 model's on one such row."""
    net = int8.model
    if all(hasattr(getattr(net, "config", None), f) for f in _CONFIG_FIELDS):
        raise TypeError(
            f"input_shape is for models of one input; a {type(net).__name__} is a forecaster "
            "(inputs static, historical, future from its config): leave input_shape out"
        )
    if isinstance(input_shape, (str, bytes)) or not isinstance(input_shape, Sequence):
        raise TypeError(f"input_shape must be a tuple of ints, got {input_shape!r}")
    shape = [V.check_int(n, "input_shape") for n in input_shape]
    if not shape or min(shape) < 1:
        raise ValueError(f"input_shape must be one or more sizes >= 1, got {tuple(input_shape)}")
    try:
        y = np.asarray(int8.forward(np.zeros((1, *shape), np.float32)))
    except (TypeError, ValueError) as e:
        raise ValueError(f"input_shape {tuple(shape)} does not fit the model: {e}") from None
    g.fresh(INPUT)
    out = emit(g, "", net, INPUT)
    return {INPUT: ["batch", *shape]}, out, ["batch", *y.shape[1:]], {}


def _metadata_props(metadata: Mapping[str, Any] | None) -> dict[str, str]:
    """``metadata`` as ONNX props (values strict JSON unless str), checked before any graph is
    built: TypeError for a non-mapping or a non-string key, ValueError for a value JSON cannot
    hold (NaN, Inf, an object)."""
    if metadata is None:
        return {}
    if not isinstance(metadata, Mapping):
        raise TypeError(f"metadata must be a mapping of str keys, got {type(metadata).__name__}")
    out = {}
    for k, v in metadata.items():
        if not isinstance(k, str):
            raise TypeError(f"metadata keys must be str, got {k!r}")
        try:
            out[k] = v if isinstance(v, str) else json.dumps(v, allow_nan=False)
        except (TypeError, ValueError) as e:
            raise ValueError(f"metadata[{k!r}] is not strict JSON ({e}): {v!r}") from None
    return out


def _max_ir(opset: int) -> int:
    from onnx import helper

    for _, ir, op, *_ in helper.VERSION_TABLE:
        if op >= opset:
            return int(ir)
    return int(helper.VERSION_TABLE[-1][1])


def _check_opset(opset: int | None) -> int:
    import onnx

    if opset is None:
        return DEFAULT_OPSET
    top = onnx.defs.onnx_opset_version()
    if isinstance(opset, bool) or not isinstance(opset, (int, np.integer)):
        raise TypeError(f"opset must be an int or None, got {type(opset).__name__}")
    if not MIN_OPSET <= int(opset) <= top:
        raise ValueError(
            f"opset must be in [{MIN_OPSET}, {top}] (per-axis DequantizeLinear needs 13; this "
            f"onnx package knows up to {top}), got {opset}"
        )
    return int(opset)


def to_onnx(
    model: Any,
    path: str | os.PathLike,
    *,
    opset: int | None = None,
    metadata: Mapping[str, Any] | None = None,
    input_shape: Sequence[int] | None = None,
) -> pathlib.Path:
    """Export a calibrated, frozen QAT model (or its int8 model) as an ONNX QDQ graph.

    Parameters
    ----------
    model : QATTemporalFusionTransformer, Int8TemporalFusionTransformer, QATModel or Int8Model
        The QAT model (the forecaster's, or one :func:`nbqat.nn.prepare_qat` made) must be past
        calibration (``phase == "qat"``) with every observer frozen (``freeze_observers()``);
        its frozen qparams are exported (through ``to_int8()`` / :func:`nbqat.nn.convert`, so
        the QAT model and its integer model give the same file). Every layer type needs an
        emitter (:mod:`nbqat.export.emitters`; register one for a layer of your own).
    path : str or os.PathLike
        The ``.onnx`` file to write; its folder must exist. Written atomically (a temporary
        file in the same folder, fsynced, then renamed).
    opset : int, optional
        Default-domain opset, 13 to the installed onnx's newest; default 21. Below 17 the
        LayerNorm is decomposed; int16/uint16 activation ranges need 21. A graph the installed
        onnxruntime cannot load at this opset is a ValueError.
    metadata : Mapping, optional
        Extra metadata props (values strict JSON unless str), e.g. feature names, the
        target's per-entity scaling, the training run's q-risk; str keys other than nbqat's
        own props (``nbqat_version``, ``source``, ``quantiles``, ``inputs``, ...).
    input_shape : sequence of int, optional
        A model of one input (not a forecaster): its input's shape without the batch axis,
        ``(6,)`` for (B, 6) rows; the graph's input ``input`` is ``(batch, *input_shape)``,
        its output ``output``.

    Returns
    -------
    pathlib.Path
        ``path``.

    Raises
    ------
    TypeError
        For another model type, a network that is not a forecaster without ``input_shape`` (or
        a forecaster with it), a layer type without an emitter, a non-int opset, or
        ``metadata`` not a mapping with str keys.
    ValueError
        Before anything is written: an uncalibrated quantizer, an unfrozen observer or a model
        still in calibration (the message names the quantizer), a quant range that no
        QuantizeLinear type of ``opset`` holds, a bad scale or zero point, an opset out of
        range or one whose graph onnxruntime cannot run, a folder of ``path`` that does not
        exist, ``metadata`` naming one of nbqat's own props or holding a value strict JSON
        cannot (NaN, Inf), or an ``input_shape`` the model refuses (its error is quoted).

    Notes
    -----
    A forecaster's graph: inputs ``static`` (B, m_s), ``historical`` (B, k, m_z), ``future``
    (B, tau, m_x) float32 with a dynamic batch; output ``quantiles`` (B, tau, Q). Weights are
    int8 codes (the exact codes of training's weight fake-quant) with a per-axis DequantizeLinear
    (``axis=1`` on the (K, N) MatMul operand); every activation fake-quant point is
    QuantizeLinear -> [Clip when the range is narrower than the storage type] ->
    DequantizeLinear. The LSTMs are unrolled (k and tau are fixed by the config): the
    hidden-state Q/DQ sits before each step's recurrent MatMul as in training, every node is
    on the main graph for onnxruntime's QDQ fusions, and no Loop/Scan body is needed. ONNX's
    QuantizeLinear divides ``x / scale`` where nbqat (PyTorch) multiplies by the float32
    reciprocal; docs/export.md gives how often that moves a code.
    """
    p = pathlib.Path(os.fspath(path))
    folder = p.parent if str(p.parent) else pathlib.Path(".")
    if not folder.is_dir():
        raise ValueError(f"path {str(p)!r}: the folder {str(folder)!r} does not exist; create it")
    if p.is_dir():
        raise ValueError(f"path {str(p)!r} is a folder; give a file name such as model.onnx")
    proto, _ = build_model(model, opset=opset, metadata=metadata, input_shape=input_shape)
    data = proto.SerializeToString()
    with atomic_open(p, "wb", prefix=".nbqat-onnx-") as f:
        f.write(data)
    return p
