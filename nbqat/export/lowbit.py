"""ONNX emission of the low-bit layers (issue 30): the weight initializers and input
quantization of :class:`~nbqat.nn.int4.GroupedLinear` and :class:`~nbqat.nn.int4.FakeQuantLinear`.

* grouped int4 weights: an INT4 (UINT4 for unsigned ranges) initializer of the (K, N) codes
  and a blocked ``DequantizeLinear`` (opset 21: ``axis=0``, ``block_size=G``, scales and zero
  points (K // G, N)); a per-channel fallback layer is one block of K (int8 codes and a
  per-axis ``DequantizeLinear`` when its range is 8-bit: ``int8_fallback``);
* float8 weights: a FLOAT8E4M3FN / FLOAT8E5M2 initializer (the float8 values of
  ``w / scale``) and a per-axis ``DequantizeLinear`` (``axis=1``, one scale per output
  channel); float8 activations a per-tensor QuantizeLinear -> DequantizeLinear pair with the
  frozen scale;
* per-token dynamic int8 activations: the per-row min / max, scale, zero point and fake
  quantization written with float operators (ReduceMin/Max, Div, Round, Clip: round half to
  even, as the QAT forward), since QuantizeLinear takes no per-row zero point computed in the
  graph for 3-D inputs.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import numpy as np

from nbqat.export._graph import GraphBuilder, QParams

_F8 = {"float8_e4m3fn": "FLOAT8E4M3FN", "float8_e5m2": "FLOAT8E5M2"}


def _need_opset(g: GraphBuilder, what: str) -> None:
    if g.opset < 21:
        raise ValueError(
            f"{what} needs opset >= 21 (INT4 / blocked or float8 DequantizeLinear), got opset "
            f"{g.opset}: export with opset=21"
        )


def _typed_init(g: GraphBuilder, hint: str, elem: str, values: np.ndarray) -> str:
    """An INT4 / UINT4 / FLOAT8 initializer (``onnx.helper.make_tensor`` packs it)."""
    from onnx import TensorProto, helper

    name = g.fresh(hint)
    vals = np.asarray(values)
    tensor = helper.make_tensor(
        name, getattr(TensorProto, elem), list(vals.shape), vals.reshape(-1).tolist()
    )
    # make_tensor leaves one packed byte per int32_data entry (two int4 codes, or one float8
    # value): store them as raw bytes (half a byte per int4 weight in the file)
    packed = np.asarray(tensor.int32_data, np.int64)
    if packed.size and (packed.min() < 0 or packed.max() > 255):  # pragma: no cover
        raise AssertionError("unexpected packing of a sub-byte initializer")
    tensor.raw_data = packed.astype(np.uint8).tobytes()
    del tensor.int32_data[:]
    g.initializers.append(tensor)
    return name


def weight_dq(g: GraphBuilder, lin: Any, hint: str) -> str:
    """The (K, N) float weight of a low-bit layer: typed codes + DequantizeLinear."""
    if hasattr(lin, "block_size"):  # GroupedLinear
        signed = lin.weight_quant_min < 0
        lo, hi = (-8, 7) if signed else (0, 15)
        if lin.weight_quant_min < lo or lin.weight_quant_max > hi:
            return _wide_weight_dq(g, lin, hint)
        _need_opset(g, hint + " (int4 weights)")
        elem = "INT4" if signed else "UINT4"
        b = int(lin.block_size[-1])
        codes = _typed_init(g, hint + ".weight_q", elem, np.asarray(lin.weight_q, np.int32).T)
        scale = g.init(hint + ".weight_scale", np.asarray(lin.weight_scale, np.float32).T)
        ins = [codes, scale]
        if np.any(lin.weight_zero_point != 0):  # symmetric: the zero point input is omitted
            ins.append(_typed_init(g, hint + ".weight_zero_point", elem, lin.weight_zero_point.T))
        return g.node("DequantizeLinear", ins, hint + ".weight", axis=0, block_size=b)
    _need_opset(g, hint + " (float8 weights)")  # FakeQuantLinear
    s = np.asarray(lin.weight_scale, np.float32).reshape(-1)  # (N,)
    vals = (np.asarray(lin.weight_dequant, np.float32) / s[:, None]).T  # exact float8 values
    elem = _F8[lin.weight_dtype]
    codes = _typed_init(g, hint + ".weight_f8", elem, vals)
    zp = _typed_init(g, hint + ".weight_zero_point", elem, np.zeros(s.shape, np.float32))
    scale = g.init(hint + ".weight_scale", s)
    return g.node("DequantizeLinear", [codes, scale, zp], hint + ".weight", axis=1)


def _wide_weight_dq(g: GraphBuilder, lin: Any, hint: str) -> str:
    """The weights of a GroupedLinear whose range is wider than 4 bits: an 8-bit per-channel
    (or per-tensor) quantizer beside per-token or float activations (``int4_weight_qconfig(G,
    "per_token" or None, int8_fallback=True)``'s fallback layers, a weight-only
    ``QConfig(activation=None)``): int codes + per-axis DequantizeLinear, as an Int8Linear's."""
    if lin.block_size[-1] != lin.in_features:
        raise ValueError(
            f"{hint}: grouped weights of range [{lin.weight_quant_min}, "
            f"{lin.weight_quant_max}] do not export (blocked DequantizeLinear takes 4-bit "
            "groups): use a 4-bit range or a per-channel weight quantizer"
        )
    flat = SimpleNamespace(
        weight_q=lin.weight_q,
        weight_scale=np.asarray(lin.weight_scale).reshape(-1),
        weight_zero_point=np.asarray(lin.weight_zero_point).reshape(-1),
    )
    return g.weight_dq(flat, hint)


def quantize_input(g: GraphBuilder, x: str, lin: Any, qname: str, hint: str) -> str:
    """The input fake quantization of a quantized matmul, by the layer's input mode.

    Parameters
    ----------
    g : GraphBuilder
    x : str
        The float input tensor.
    lin : Int8Linear, GroupedLinear or FakeQuantLinear
    qname, hint : str
        The quantizer's name (messages) and the node-name hint.

    Returns
    -------
    str
        The fake-quantized (or, for float activations, the unchanged) input.
    """
    mode = getattr(lin, "input_mode", "per_tensor")
    if hasattr(lin, "weight_dequant"):  # float8
        fq = lin.input_fq
        if fq is None:
            return x
        if fq.dtype not in _F8:  # the run's per-tensor int8 activations beside float8 weights
            s8, z8 = (np.asarray(v).reshape(-1)[0] for v in (fq.scale, fq.zero_point))
            qp8 = QParams(qname, np.float32(s8), int(z8), int(fq.quant_min), int(fq.quant_max))
            return g.qdq(x, qp8, hint)
        elem = _F8[fq.dtype]
        s = g.const(np.float32(np.asarray(fq.scale).reshape(-1)[0]))
        zp = _typed_init(g, hint + ".zero_point", elem, np.zeros((), np.float32))
        q = g.node("QuantizeLinear", [x, s, zp], hint)
        return g.node("DequantizeLinear", [q, s, zp], hint)
    if mode == "float":
        return x
    if mode == "per_token":
        return _per_token(g, x, lin.input_fq, hint)
    qp = QParams(
        qname,
        np.float32(lin.input_scale),
        int(lin.input_zero_point),
        int(lin.input_quant_min),
        int(lin.input_quant_max),
    )
    return g.qdq(x, qp, hint)


def _per_token(g: GraphBuilder, x: str, fq: Any, hint: str) -> str:
    """Dynamic per-token asymmetric fake quantization (torchao's choose_qparams_affine)."""
    qmin, qmax = float(fq.quant_min), float(fq.quant_max)
    # ReduceMin / ReduceMax take their axes as an input from opset 18, as an attribute before
    red: dict = {"axes": [-1]} if g.opset < 18 else {}
    ins = [x] if red else [x, g.const([-1], np.int64)]
    zero = g.const(np.float32(0))
    mn = g.node("Min", [g.node("ReduceMin", ins, hint, keepdims=1, **red), zero], hint)
    mx = g.node("Max", [g.node("ReduceMax", ins, hint, keepdims=1, **red), zero], hint)
    s = g.node("Div", [g.node("Sub", [mx, mn], hint), g.const(np.float32(qmax - qmin))], hint)
    s = g.node("Max", [s, g.const(np.float32(fq.eps))], hint)
    lo, hi = g.const(np.float32(qmin)), g.const(np.float32(qmax))
    zp = g.node("Sub", [lo, g.node("Round", [g.node("Div", [mn, s], hint)], hint)], hint)
    zp = g.node("Clip", [zp, lo, hi], hint)
    inv = g.node("Div", [g.const(np.float32(1)), s], hint)
    r = g.node("Add", [g.node("Round", [g.node("Mul", [x, inv], hint)], hint), zp], hint)
    q = g.node("Clip", [r, lo, hi], hint)
    return g.node("Mul", [g.node("Sub", [q, zp], hint), s], hint)
