"""The ONNX graph builder shared by the layer emitters (``onnx.helper`` / ``numpy_helper``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

#: Storage types of QuantizeLinear / DequantizeLinear by the first opset that has them
#: (onnx/defs/quantization/defs.cc: 10/13 int8 and uint8; 21 int16 and uint16).
_STORAGE = (
    (np.dtype(np.int8), 13),
    (np.dtype(np.uint8), 13),
    (np.dtype(np.int16), 21),
    (np.dtype(np.uint16), 21),
)


@dataclass(frozen=True)
class QParams:
    """Frozen per-tensor quantization parameters of one fake-quant point.

    Attributes
    ----------
    name : str
        The quantizer's name in the nbqat model (for error messages and node names).
    scale : numpy.float32
        > 0, finite.
    zero_point : int
    quant_min, quant_max : int
        The code range (PyTorch's ``quant_min`` / ``quant_max``).
    """

    name: str
    scale: np.float32
    zero_point: int
    quant_min: int
    quant_max: int


def storage_dtype(qmin: int, qmax: int, zero_point: Any, opset: int, what: str) -> np.dtype:
    """The narrowest QuantizeLinear storage type of ``opset`` holding ``[qmin, qmax]`` and the
    zero point(s); signed types first when the range is signed.

    Raises
    ------
    ValueError
        When no integer type of ``opset`` can hold the range (naming ``what``).
    """
    zp = np.asarray(zero_point).reshape(-1)
    lo = min(int(qmin), int(zp.min()) if zp.size else int(qmin))
    hi = max(int(qmax), int(zp.max()) if zp.size else int(qmax))
    order = [t for t in _STORAGE if (t[0].kind == "i") == (lo < 0)]
    order += [t for t in _STORAGE if t not in order]
    for dt, first_opset in order:
        info = np.iinfo(dt)
        if opset >= first_opset and info.min <= lo and hi <= info.max:
            return dt
    names = ", ".join(str(t[0]) for t in _STORAGE if opset >= t[1])
    raise ValueError(
        f"{what}: the quant range [{qmin}, {qmax}] (zero point {zp.tolist()[:4]}) cannot be "
        f"stored in any QuantizeLinear type of opset {opset} ({names}); use a range that fits "
        "int8/uint8, or opset >= 21 for int16/uint16"
    )


class GraphBuilder:
    """Collects nodes and initializers; gives every tensor a unique name.

    Parameters
    ----------
    opset : int
        The default-domain opset the nodes are written for.
    int8_layers : dict, optional
        The integer model's ``layers`` (its integer Linear / LSTM layers by module name), kept
        as :attr:`layers` for reference; the emitters dispatch on the module types (a
        :class:`~nbqat.nn.QuantizedLinear` emits its integer matmul, a ``Linear`` a float one).
    """

    def __init__(self, opset: int, int8_layers: dict[str, Any] | None = None) -> None:
        from onnx import helper, numpy_helper

        self._helper = helper
        self._np_helper = numpy_helper
        self.opset = int(opset)
        self.layers = {} if int8_layers is None else int8_layers
        self.nodes: list[Any] = []
        self.initializers: list[Any] = []
        self._names: set[str] = set()
        self._consts: dict[tuple, str] = {}
        #: names of the float inputs of every QuantizeLinear (the division study reads them)
        self.quantize_inputs: list[tuple[str, QParams]] = []

    # ------------------------------------------------------------------ names and tensors
    def fresh(self, hint: str) -> str:
        base = hint.replace("/", ".") or "t"
        name, i = base, 1
        while name in self._names:
            name = f"{base}_{i}"
            i += 1
        self._names.add(name)
        return name

    def init(self, hint: str, array: np.ndarray) -> str:
        """Add an initializer (the array is copied, C-contiguous) and return its name."""
        name = self.fresh(hint)
        arr = np.array(array, order="C", copy=True)  # keeps 0-d (ascontiguousarray would not)
        self.initializers.append(self._np_helper.from_array(arr, name))
        return name

    def const(self, value: Any, dtype: Any = np.float32) -> str:
        """A shared scalar / small-vector initializer (deduplicated by value)."""
        arr = np.asarray(value, dtype=dtype)
        key = (arr.dtype.str, arr.shape, arr.tobytes())
        if key not in self._consts:
            self._consts[key] = self.init("const", arr)
        return self._consts[key]

    def node(self, op: str, inputs: list[str], hint: str, n_out: int = 1, **attrs: Any) -> Any:
        """Append one node; returns its output name (or the list of ``n_out`` names)."""
        outs = [
            self.fresh(f"{hint}.{op}" if n_out == 1 else f"{hint}.{op}{i}") for i in range(n_out)
        ]
        self.nodes.append(
            self._helper.make_node(op, inputs, outs, name=self.fresh("n." + outs[0]), **attrs)
        )
        return outs[0] if n_out == 1 else outs

    # ------------------------------------------------------------------ common patterns
    def unsqueeze(self, x: str, axis: int, hint: str) -> str:
        return self.node("Unsqueeze", [x, self.const([axis], np.int64)], hint)

    def gather(self, x: str, index: int, axis: int, hint: str) -> str:
        """``x`` indexed by the scalar ``index`` on ``axis`` (the axis is dropped)."""
        return self.node("Gather", [x, self.const(index, np.int64)], hint, axis=axis)

    def reshape(self, x: str, shape: list[int], hint: str) -> str:
        """Reshape with ONNX's 0 (keep that dimension) / -1 (infer) conventions."""
        return self.node("Reshape", [x, self.const(shape, np.int64)], hint)

    def qdq(self, x: str, qp: QParams, hint: str) -> str:
        """A fake-quant point: QuantizeLinear -> (Clip when ``[quant_min, quant_max]`` is
        narrower than the storage type) -> DequantizeLinear with the frozen qparams; for a
        16-bit storage type the Clip is a float clamp before the QuantizeLinear (same codes;
        onnxruntime implements Clip on 8-bit integers only)."""
        dt = storage_dtype(qp.quant_min, qp.quant_max, qp.zero_point, self.opset, qp.name)
        scale = self.const(np.float32(qp.scale))
        zp = self.const(qp.zero_point, dt)
        info = np.iinfo(dt)
        narrow = qp.quant_min > info.min or qp.quant_max < info.max
        if narrow and dt.itemsize > 1:
            # onnxruntime has no 16-bit integer Clip: clamp in float before quantizing, to
            # (q - zp) * s of the two end codes (rint(lo / s) + zp == quant_min since the
            # relative error of lo / s is ~1e-7 and |quant_min - zp| <= 65535)
            s32 = np.float32(qp.scale)
            lo = self.const(np.float32(qp.quant_min - qp.zero_point) * s32)
            hi = self.const(np.float32(qp.quant_max - qp.zero_point) * s32)
            x = self.node("Clip", [x, lo, hi], hint)
        self.quantize_inputs.append((x, qp))
        q = self.node("QuantizeLinear", [x, scale, zp], hint)
        if narrow and dt.itemsize == 1:  # QCDQ: Clip on the int8 / uint8 codes
            lo, hi = self.const(qp.quant_min, dt), self.const(qp.quant_max, dt)
            q = self.node("Clip", [q, lo, hi], hint)
        return self.node("DequantizeLinear", [q, scale, zp], hint)

    def weight_dq(self, lin: Any, hint: str) -> str:
        """The (K, N) float weight of an ``Int8Linear`` as int codes + per-axis
        DequantizeLinear (``axis=1``: one scale per output channel of ``x @ W``); the low-bit
        layers' are :func:`nbqat.export.lowbit.weight_dq`
        (:func:`nbqat.export.emitters.weight_dq` picks by layer type)."""
        dt = storage_dtype(
            int(lin.weight_q.min()) if lin.weight_q.size else 0,
            int(lin.weight_q.max()) if lin.weight_q.size else 0,
            lin.weight_zero_point,
            self.opset,
            hint + ".weight_fake_quant",
        )
        codes = self.init(hint + ".weight_q", np.asarray(lin.weight_q).T.astype(dt))
        scale = self.init(hint + ".weight_scale", np.asarray(lin.weight_scale, np.float32))
        zp = self.init(hint + ".weight_zero_point", np.asarray(lin.weight_zero_point).astype(dt))
        return self.node("DequantizeLinear", [codes, scale, zp], hint + ".weight", axis=1)
