"""ONNX export (QDQ) of the QAT forecaster, the parity harness and the main job's export step.

* :func:`to_onnx` -- a calibrated, frozen ``QATTemporalFusionTransformer`` (or its
  ``to_int8()`` model) as an ONNX graph with int8 weights and QuantizeLinear /
  DequantizeLinear at every fake-quant point (:mod:`nbqat.export.emitters`: one emitter per
  layer type).
* :func:`check_parity` -- nbqat fake quant, nbqat int8, onnxruntime (optimisations off and
  default) and ``onnx.reference`` on the same inputs: differences in output quantization steps,
  bit-identical fractions, q-risk.
* :func:`division_study` -- how often ONNX's ``x / scale`` and PyTorch's ``x * (1 / scale)``
  give different codes.
* :func:`export_run` -- what ``nbqat train`` calls: writes ``model.onnx`` and returns the
  ``onnx_parity`` block of metrics.json.
"""

from nbqat.export.job import export_run, run_metadata, summary_lines
from nbqat.export.onnx_export import to_onnx
from nbqat.export.parity import check_parity, division_study

__all__ = [
    "check_parity",
    "division_study",
    "export_run",
    "run_metadata",
    "summary_lines",
    "to_onnx",
]
