"""Checks of a model before export: calibrated, frozen, representable (ValueError, nothing
written)."""

from __future__ import annotations

from typing import Any

import numpy as np

from nbqat.quantization._quantizer_base import check_observed


def check_qat(qat: Any) -> None:
    """Raise ValueError unless every quantizer of ``qat`` has observed data
    (:func:`~nbqat.quantization._quantizer_base.check_observed`: ``UncalibratedError``, a
    ValueError), fake-quantizes (QAT phase) and is frozen; the message names the first
    offending quantizer."""
    observe_only: set[str] = getattr(qat, "_observe_only", set())
    check_observed(qat.fake_quants)
    if qat.phase != "qat":
        raise ValueError(
            "cannot export: the QAT model is in its calibration phase (fake quantization off): "
            "call qat.disable_calibration() and qat.freeze_observers() first"
        )
    if not getattr(qat, "observers_frozen", True):
        raise ValueError(
            f"cannot export: the observer of quantizer {next(iter(qat.fake_quants))!r} is not "
            f"frozen (nor are the other {len(qat.fake_quants) - 1}; their qparams would still "
            "change in training mode): call qat.freeze_observers() first"
        )
    for n, fq in qat.fake_quants.items():
        learning = bool(getattr(fq, "learning_enabled", False))
        if bool(fq.observer_enabled) or learning:
            raise ValueError(
                f"cannot export: the observer of quantizer {n!r} is not frozen (its qparams "
                "would still change): call qat.freeze_observers() first"
            )
        if n not in observe_only and not bool(fq.fake_quant_enabled):
            raise ValueError(
                f"cannot export: quantizer {n!r} has fake quantization disabled, so the "
                "exported QDQ graph would not be the model's function; enable it "
                "(fq.enable_fake_quant(True))"
            )


def check_qparams(name: str, scale: Any, zero_point: Any, qmin: int, qmax: int) -> None:
    """Raise ValueError for a non-positive or non-finite scale, an empty range or a zero point
    outside ``[quant_min, quant_max]``."""
    s = np.asarray(scale, dtype=np.float32).reshape(-1)
    if s.size == 0 or not bool(np.all(np.isfinite(s) & (s > 0))):
        raise ValueError(
            f"cannot export: quantizer {name!r} has a non-positive or non-finite scale "
            f"{s[:4].tolist()}: recalibrate it"
        )
    if int(qmin) > int(qmax):
        raise ValueError(f"cannot export: quantizer {name!r} has quant_min > quant_max")
    z = np.asarray(zero_point).reshape(-1)
    if z.size and (int(z.min()) < int(qmin) or int(z.max()) > int(qmax)):
        raise ValueError(
            f"cannot export: quantizer {name!r} has a zero point {z[:4].tolist()} outside "
            f"[{qmin}, {qmax}]"
        )


def check_int8(int8: Any) -> None:
    """Check every qparam of an ``Int8TemporalFusionTransformer`` (see :func:`check_qparams`)."""
    for name, layer in int8.layers.items():
        lins = [(name, layer)] if hasattr(layer, "weight_scale") else []
        if not lins:
            lins = [(name + ".ih", layer.ih), (name + ".hh", layer.hh)]
        for lname, lin in lins:
            if getattr(lin, "input_scale", None) is None or not hasattr(lin, "weight_q"):
                continue  # low-bit: dynamic / float8 / float inputs (checked when built)
            check_qparams(
                lname + ".input",
                lin.input_scale,
                lin.input_zero_point,
                lin.input_quant_min,
                lin.input_quant_max,
            )
            check_qparams(
                lname + ".weight", lin.weight_scale, lin.weight_zero_point, -(2**31), 2**31 - 1
            )
    for name, mod in int8.model.named_modules():
        afq = getattr(mod, "attention_fake_quant", None)
        if afq is not None:
            check_qparams(
                name + ".attention_fake_quant",
                afq.scale,
                afq.zero_point,
                afq.quant_min,
                afq.quant_max,
            )
    if int8.output_scale is None:  # a converted generic model: no output quantizer
        return
    check_qparams(
        "output_fake_quant",
        int8.output_scale,
        int8.output_zero_point,
        int8.output_quant_min,
        int8.output_quant_max,
    )


def check_graph(proto: Any, opset: int) -> None:
    """``onnx.checker.check_model(full_check=True)``, then raise ValueError unless the
    installed onnxruntime loads ``proto`` (its CPU provider, no graph optimisation): an opset
    the onnx package knows but onnxruntime does not implement yet (QuantizeLinear of onnx
    1.23's opset 28 in onnxruntime 1.32) would write a file that no ``nbqat predict --engine
    onnx`` or parity check can run."""
    import onnx
    import onnxruntime as ort
    from onnxruntime.capi.onnxruntime_pybind11_state import NotImplemented as NotImpl

    onnx.checker.check_model(proto, full_check=True)
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.log_severity_level = 4
    try:
        ort.InferenceSession(proto.SerializeToString(), so, providers=["CPUExecutionProvider"])
    except NotImpl as e:
        why = str(e).split(": ", 2)[-1][:200]
        raise ValueError(
            f"onnxruntime {ort.__version__} cannot run the graph at opset {opset} ({why}): "
            "export with a lower opset (default 21)"
        ) from None
