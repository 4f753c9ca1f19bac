"""Parity harness: the same inputs through nbqat (fake quant, int8) and three ONNX runtimes."""

from __future__ import annotations

import pathlib
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

#: Engines in the order they are reported.
ENGINES = ("fake_quant", "int8", "ort_disable_all", "ort_default", "reference")
#: Pairs compared (the int8 reference against every ONNX runtime first).
PAIRS = (
    ("int8", "ort_disable_all"),
    ("int8", "ort_default"),
    ("int8", "reference"),
    ("fake_quant", "int8"),
    ("fake_quant", "ort_disable_all"),
    ("ort_disable_all", "ort_default"),
    ("ort_disable_all", "reference"),
)


def _load(onnx_model: Any) -> Any:
    import onnx

    if isinstance(onnx_model, (str, pathlib.Path)):
        return onnx.load(str(onnx_model))
    if isinstance(onnx_model, onnx.ModelProto):
        return onnx_model
    raise TypeError(f"onnx_model must be a path or an onnx.ModelProto, got {type(onnx_model)}")


def ort_session(proto: Any, optimize: bool) -> Any:
    """An onnxruntime CPU session (one intra-op thread: deterministic sums); ``optimize``
    False sets ``ORT_DISABLE_ALL`` (Q/DQ pairs run as written), True keeps the default
    (``ORT_ENABLE_ALL``: Q/DQ may be fused into integer kernels)."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    so.inter_op_num_threads = 1
    so.log_severity_level = 3
    # int4 DequantizeLinear -> MatMul fuses into MatMulNBits; its default accuracy level 4
    # quantizes the activations to int8 per block: level 1 keeps them float32 (issue 30)
    so.add_session_config_entry("session.qdq_matmulnbits_accuracy_level", "1")
    if not optimize:
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(proto.SerializeToString(), so, providers=["CPUExecutionProvider"])


class _Rows:
    """The windows compared: three arrays, or a :class:`nbqat.data.SplitWindows` read batch
    by batch (so the memory of a parity check does not grow with the number of windows)."""

    def __init__(self, static: Any, historical: Any, future: Any) -> None:
        self.split = static if historical is None and hasattr(static, "batch") else None
        if self.split is not None:
            if future is not None:
                raise ValueError("with a SplitWindows as static, pass historical=future=None")
            self.n = len(self.split)
            self.arrays: list[np.ndarray] = []
            return
        if historical is None or future is None:
            raise TypeError(
                "pass the three input arrays (static, historical, future) or one SplitWindows"
            )
        self.arrays = [
            np.ascontiguousarray(x, dtype=np.float32) for x in (static, historical, future)
        ]
        self.n = self.arrays[0].shape[0]
        if any(x.shape[0] != self.n for x in self.arrays):
            raise ValueError(
                f"static, historical and future must share the batch size, got "
                f"{[x.shape[0] for x in self.arrays]}"
            )

    def get(self, i0: int, i1: int) -> list[np.ndarray]:
        i1 = min(i1, self.n)
        if self.split is None:
            return [x[i0:i1] for x in self.arrays]
        s, h, f, _ = self.split.batch(np.arange(i0, i1))
        return [np.ascontiguousarray(x, dtype=np.float32) for x in (s, h, f)]


def _check_rows(rows: _Rows, batch_size: Any, reference_rows: Any = None) -> int:
    """Validate ``batch_size`` (an int >= 1), ``reference_rows`` (None or an int >= 0) and
    that there is a window; returns ``batch_size`` as an int."""
    from nbqat._validate import check_int

    bs = check_int(batch_size, "batch_size")
    if bs < 1:
        raise ValueError(f"`batch_size` must be >= 1 (windows per run), got {bs}")
    if reference_rows is not None and check_int(reference_rows, "reference_rows") < 0:
        raise ValueError(
            f"`reference_rows` must be >= 0 (0 skips the reference evaluator) or None (all "
            f"rows), got {reference_rows}"
        )
    if rows.n == 0:
        raise ValueError("no windows to compare: the inputs (or the SplitWindows) are empty")
    return bs


def _batched(fn: Callable, rows: _Rows, bs: int, n: int | None = None) -> np.ndarray:
    n = rows.n if n is None else n
    outs = [fn(*rows.get(i, min(i + bs, n))) for i in range(0, n, bs)]
    return np.concatenate(outs).astype(np.float32)


def _is_int8(model: Any) -> bool:
    from nbqat.nn.convert import Int8Model
    from nbqat.nn.int8 import Int8TemporalFusionTransformer

    return isinstance(model, Int8TemporalFusionTransformer | Int8Model)


def _pair_stats(a: np.ndarray, b: np.ndarray, step: float) -> dict:
    """Differences of two engines' outputs; the step figures are None without an output
    quantizer (``step`` NaN: a converted generic model)."""
    d = np.abs(a.astype(np.float64) - b.astype(np.float64))
    mx = float(d.max()) if d.size else 0.0
    has_step = bool(np.isfinite(step))
    return {
        "rows": int(a.shape[0]),
        "max_abs_diff": mx,
        "max_diff_output_steps": mx / step if has_step else None,
        "bit_identical_fraction": float(np.mean(a.view(np.uint32) == b.view(np.uint32))),
        "within_1_step_fraction": float(np.mean(d <= step * (1 + 1e-6))) if has_step else None,
    }


def check_parity(
    model: Any,
    onnx_model: Any,
    static: Any,
    historical: np.ndarray | None = None,
    future: np.ndarray | None = None,
    *,
    int8: Any = None,
    target: np.ndarray | None = None,
    unscale: Callable[[np.ndarray, np.ndarray], np.ndarray] | None = None,
    quantiles: Sequence[float] | None = None,
    reference_rows: int | None = 64,
    batch_size: int = 256,
) -> dict:
    """Run the same windows through five engines and compare them pairwise.

    Engines: ``fake_quant`` (``model.predict``, the QAT model; skipped when ``model`` is an
    int8 model), ``int8`` (the integer reference), ``ort_disable_all`` and ``ort_default``
    (onnxruntime CPU with ``ORT_DISABLE_ALL`` / default optimisations), ``reference``
    (``onnx.reference.ReferenceEvaluator``, pure Python, on the first ``reference_rows`` rows).

    Parameters
    ----------
    model : QATTemporalFusionTransformer, Int8TemporalFusionTransformer, QATModel or Int8Model
        The QAT model (engine ``fake_quant``) or only its integer model.
    onnx_model : str, pathlib.Path or onnx.ModelProto
        The exported model (:func:`~nbqat.export.to_onnx`).
    static, historical, future : ndarray float32
        Inputs (B, m_s), (B, k, m_z), (B, tau, m_x). Or ``static`` a
        :class:`nbqat.data.SplitWindows` and the other two omitted: its windows are read
        ``batch_size`` at a time (memory independent of the number of windows).
    int8 : Int8TemporalFusionTransformer or Int8Model, optional
        Default :func:`nbqat.nn.convert` of ``model`` (``to_int8()`` for the forecaster), or
        ``model`` itself when it is an integer model. Without an output quantizer (a generic
        model) the ``*_output_steps`` figures are None.
    target : ndarray (B, tau), optional
        Targets in the units of ``unscale``'s output, for each engine's q-risk.
    unscale : callable, optional
        ``unscale(pred, idx) -> target units`` for the predictions ``pred`` (n, tau, Q) of the
        rows ``idx`` (``np.arange(n)``: the reference evaluator runs the first rows only), e.g.
        :meth:`nbqat.data.SplitWindows.unscale`; default identity.
    quantiles : sequence of float, optional
        Default: the ONNX model's ``quantiles`` metadata.
    reference_rows : int or None, default 64
        Rows run by the reference evaluator (None: all; 0: skip it; always skipped below
        opset :data:`REFERENCE_MIN_OPSET`, 19, where it has no Quantize/DequantizeLinear).
    batch_size : int, default 256

    Returns
    -------
    dict
        ``output_scale`` (the output quantization step; None without an output quantizer),
        ``rows``, ``engines`` (per engine:
        rows run and, with ``target``, the q-risk), ``pairs`` (per pair: max abs difference,
        in output steps, bit-identical and within-one-step fractions, over the rows both ran),
        and ``_predictions`` (engine -> float32 (rows, tau, Q) array; not JSON).

    Raises
    ------
    ValueError
        On inputs whose batch sizes differ, no windows, a ``target`` of another shape than
        (B, tau), a ``batch_size`` < 1 or a negative ``reference_rows``.
    TypeError
        When only some of the three input arrays are given, or a non-integer ``batch_size``
        or ``reference_rows``.
    """
    rows = _Rows(static, historical, future)
    n = rows.n
    batch_size = _check_rows(rows, batch_size, reference_rows)
    proto = _load(onnx_model)
    int8 = _int8_of(model, int8)
    tau = int8.model.config.prediction_horizon
    if target is not None and np.shape(target) != (n, tau):
        raise ValueError(f"target must have shape {(n, tau)}, got {np.shape(target)}")
    q = _quantiles_of(proto, quantiles)
    fake = None if _is_int8(model) else model
    nref = _reference_rows(proto, reference_rows, n)
    preds = _run_engines(fake, int8, proto, rows, nref, batch_size)
    return _report(preds, getattr(int8, "output_scale", None), n, target, unscale, q)


#: The lowest opset whose Quantize/DequantizeLinear ``onnx.reference.ReferenceEvaluator``
#: implements (onnx 1.17-1.23): older exports skip the ``reference`` engine.
REFERENCE_MIN_OPSET = 19


def _reference_rows(proto: Any, reference_rows: int | None, n: int) -> int:
    """The rows the reference evaluator runs: ``reference_rows`` (None: all) of the ``n``, or
    none below :data:`REFERENCE_MIN_OPSET` (no Quantize/DequantizeLinear there)."""
    opset = max((o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")), default=0)
    if opset < REFERENCE_MIN_OPSET:
        return 0
    return n if reference_rows is None else min(int(reference_rows), n)


def _report(
    preds: dict[str, np.ndarray], scale: Any, n: int, target: Any, unscale: Any, q: tuple
) -> dict[str, Any]:
    """check_parity's result from the engines' predictions."""
    step = float("nan") if scale is None else float(scale)
    # no output quantizer (a converted generic model): no step, reported as None (strict JSON)
    out: dict[str, Any] = {"output_scale": None if scale is None else step, "rows": n}
    out["engines"] = {
        name: _engine_info(preds[name], target, unscale, q) for name in ENGINES if name in preds
    }
    out["pairs"] = {}
    for a, b in PAIRS:
        if a in preds and b in preds:
            m = min(len(preds[a]), len(preds[b]))
            out["pairs"][f"{a}_vs_{b}"] = _pair_stats(preds[a][:m], preds[b][:m], step)
    out["_predictions"] = preds
    return out


def _int8_of(model: Any, int8: Any) -> Any:
    """The integer model compared: ``int8``, or ``model`` itself, or ``convert(model)``."""
    if int8 is not None:
        return int8
    from nbqat.nn.convert import convert

    return model if _is_int8(model) else convert(model)


def _quantiles_of(proto: Any, quantiles: Sequence[float] | None) -> tuple[float, ...]:
    import json

    if quantiles is not None:
        return tuple(quantiles)
    props = {p.key: p.value for p in proto.metadata_props}
    return tuple(json.loads(props["quantiles"]))


def _engine_info(
    p: np.ndarray, target: Any, unscale: Callable | None, q: tuple[float, ...]
) -> dict[str, Any]:
    """Rows run and, with a target, the q-risk of one engine's predictions ``p``."""
    info: dict[str, Any] = {"rows": int(p.shape[0])}
    if target is not None:
        from nbqat.nn.loss import q_risk_table as q_risk

        un = unscale(p, np.arange(len(p))) if unscale is not None else p
        y = np.asarray(target, np.float64)[: len(p)]  # NaN: a step not scored (fill_gaps)
        info["q_risk"] = q_risk(np.asarray(un, np.float64), y, q, np.isfinite(y))
    return info


def _run_engines(
    fake: Any, int8: Any, proto: Any, rows: _Rows, nref: int, batch_size: int
) -> dict[str, np.ndarray]:
    """float32 predictions of every engine (the reference evaluator on the first ``nref``)."""
    preds: dict[str, np.ndarray] = {}
    if fake is not None:  # predict: no observer update (a generic QATModel: frozen forward)
        preds["fake_quant"] = _batched(getattr(fake, "predict", fake.forward), rows, batch_size)
    preds["int8"] = _batched(int8.forward, rows, batch_size)
    names = ("static", "historical", "future")
    for name, opt in (("ort_disable_all", False), ("ort_default", True)):
        sess = ort_session(proto, opt)

        def _ort(*xs: np.ndarray, sess: Any = sess) -> np.ndarray:
            return sess.run(None, dict(zip(names, xs)))[0]

        preds[name] = _batched(_ort, rows, batch_size)
    if nref > 0:
        from onnx.reference import ReferenceEvaluator

        ev = ReferenceEvaluator(proto)

        def _ref(*xs: np.ndarray) -> np.ndarray:
            res: Any = ev.run(None, dict(zip(names, xs)))
            return res[0]

        preds["reference"] = _batched(_ref, rows, batch_size, nref)
    return preds


def _quantize_points(proto: Any) -> list[tuple[str, str, float, int, np.dtype, int, int]]:
    """(x name, Q output name, scale, zero point, storage dtype, lo, hi) of every per-tensor
    QuantizeLinear, with the Clip range when a Clip follows it."""
    from onnx import numpy_helper

    inits = {i.name: numpy_helper.to_array(i) for i in proto.graph.initializer}
    consumers: dict[str, Any] = {}
    for node in proto.graph.node:
        for i in node.input:
            consumers.setdefault(i, node)
    pts = []
    for node in proto.graph.node:
        if node.op_type != "QuantizeLinear" or inits[node.input[1]].size != 1:
            continue
        zp = inits[node.input[2]]
        info = np.iinfo(zp.dtype)
        lo, hi = int(info.min), int(info.max)
        nxt = consumers.get(node.output[0])
        if nxt is not None and nxt.op_type == "Clip":
            lo, hi = int(inits[nxt.input[1]]), int(inits[nxt.input[2]])
        pts.append(
            (node.input[0], node.output[0], float(inits[node.input[1]]), int(zp), zp.dtype, lo, hi)
        )
    return pts


def division_study(
    onnx_model: Any,
    static: Any,
    historical: np.ndarray | None = None,
    future: np.ndarray | None = None,
    batch_size: int = 256,
) -> dict:
    """How often ONNX's ``round(x / scale)`` and PyTorch's ``round(x * float32(1 / scale))``
    give different codes, on the float tensors that reach each QuantizeLinear.

    The graph is run by onnxruntime (``ORT_DISABLE_ALL``) with the inputs and outputs of every
    per-tensor QuantizeLinear as extra outputs; the runtime's codes are compared with NumPy's
    float32 division and with the reciprocal product, both rounded half to even and saturated
    to the quantizer's range.

    Parameters
    ----------
    onnx_model : str, pathlib.Path or onnx.ModelProto
    static, historical, future : ndarray float32
        Inputs (B, m_s), (B, k, m_z), (B, tau, m_x), or a SplitWindows as in
        :func:`check_parity`.
    batch_size : int, default 256

    Returns
    -------
    dict
        ``codes`` (values quantized), ``runtime_vs_reciprocal`` (codes where onnxruntime and
        the reciprocal product differ), ``runtime_vs_division`` (onnxruntime against NumPy's
        division: 0 when it divides), ``max_code_diff``, ``quantizers_affected`` and the
        fraction ``runtime_vs_reciprocal / codes``.

    Raises
    ------
    ValueError, TypeError
        As :func:`check_parity` (no windows, a ``batch_size`` that is not an int >= 1).
    """
    from onnx import TensorProto, helper

    rows = _Rows(static, historical, future)
    batch_size = _check_rows(rows, batch_size)
    proto = _load(onnx_model)
    pts = _quantize_points(proto)
    m = type(proto)()
    m.CopyFrom(proto)
    del m.graph.output[1:]
    for x, qo, _, _, dt, _, _ in pts:
        m.graph.output.append(helper.make_tensor_value_info(x, TensorProto.FLOAT, None))
        ttype = helper.np_dtype_to_tensor_dtype(np.dtype(dt))
        m.graph.output.append(helper.make_tensor_value_info(qo, ttype, None))
    sess = ort_session(m, optimize=False)
    names = [o.name for o in m.graph.output]
    total = recip = div = maxd = 0
    affected: set[str] = set()
    for i in range(0, rows.n, batch_size):
        feed = dict(zip(("static", "historical", "future"), rows.get(i, i + batch_size)))
        vals = dict(zip(names, sess.run(names, feed)))
        for x, qo, s, zp, _, lo, hi in pts:
            xv = vals[x].astype(np.float32)
            q_rt = vals[qo].astype(np.int64)
            s32 = np.float32(s)
            q_div = np.clip(np.rint(xv / s32) + zp, lo, hi).astype(np.int64)
            q_mul = np.clip(np.rint(xv * (np.float32(1) / s32)) + zp, lo, hi).astype(np.int64)
            nd = int(np.count_nonzero(q_rt != q_mul))
            total += xv.size
            recip += nd
            div += int(np.count_nonzero(q_rt != q_div))
            if nd:
                affected.add(x)
                maxd = max(maxd, int(np.max(np.abs(q_rt - q_mul))))
    return {
        "quantizers": len(pts),
        "codes": total,
        "runtime_vs_reciprocal": recip,
        "runtime_vs_reciprocal_fraction": recip / max(total, 1),
        "runtime_vs_division": div,
        "max_code_diff": maxd,
        "quantizers_affected": len(affected),
    }
