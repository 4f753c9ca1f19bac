"""ONNX export of models of one input (``to_onnx(..., input_shape=...)``): a Sequential of
nbqat layers, nested, on 2-D and 3-D input, and the errors.

Oracles: onnxruntime and ``onnx.reference`` run the exported graph; the nbqat int8 model
(``convert``) and the frozen fake-quant model it must equal are themselves tested against
PyTorch (tests/test_prepare_qat.py).
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx.reference import ReferenceEvaluator
from ref_nn import SMALL_TFT, forecast_batch

import nbqat
from nbqat.export import to_onnx
from nbqat.export.parity import ort_session
from nbqat.nn import (
    ELU,
    Dropout,
    LayerNorm,
    Linear,
    Module,
    ParameterBuffer,
    Sequential,
    TemporalFusionTransformer,
    convert,
    prepare_qat,
)
from nbqat.nn.qat import QATTemporalFusionTransformer
from nbqat.quantization.qconfig import float8_qconfig, int4_weight_qconfig


def _frozen_qat(model, x, qconfig=None):
    ParameterBuffer(model, seed=3)
    qat = prepare_qat(model, qconfig, config=nbqat.QATConfig(calibration_batches=2))
    qat.calibrate([x[: len(x) // 2], x[len(x) // 2 :]])
    qat.freeze_observers()
    qat.eval()
    return qat


@pytest.mark.parametrize("shape", [(6,), (4, 6)], ids=["rows", "sequences"])
def test_a_sequential_runs_in_onnxruntime_as_its_int8_model(rng, tmp_path, shape):
    model = Sequential(
        Linear(6, 16), ELU(), Dropout(0.2), LayerNorm(16), Sequential(Linear(16, 8), ELU())
    )
    x = rng.standard_normal((64, *shape)).astype(np.float32)
    qat = _frozen_qat(model, x)
    path = to_onnx(qat, tmp_path / "m.onnx", input_shape=shape)
    sess = ort_session(onnx.load(path), optimize=False)
    assert [i.name for i in sess.get_inputs()] == ["input"]
    assert sess.get_outputs()[0].name == "output"
    assert sess.get_outputs()[0].shape == ["batch", *shape[:-1], 8]
    want = convert(qat)(x)
    got = sess.run(None, {"input": x})[0]
    fused = ort_session(onnx.load(path), optimize=True).run(None, {"input": x})[
        0
    ]  # integer kernels
    ref = ReferenceEvaluator(str(path)).run(None, {"input": x})[0]
    assert got.shape == want.shape == (64, *shape[:-1], 8)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5)
    np.testing.assert_allclose(ref, want, rtol=0, atol=1e-5)
    np.testing.assert_allclose(fused, want, rtol=0, atol=1e-5)
    np.testing.assert_allclose(qat(x), want, rtol=0, atol=1e-5)
    # the int8 model itself exports to the same graph
    again = to_onnx(convert(qat), tmp_path / "c.onnx", input_shape=shape)
    np.testing.assert_array_equal(
        ort_session(onnx.load(again), optimize=False).run(None, {"input": x})[0], got
    )


@pytest.mark.parametrize(
    "qconfig", [int4_weight_qconfig(16), float8_qconfig()], ids=["int4_g16", "float8"]
)
def test_low_bit_weights_export_too(rng, tmp_path, qconfig):
    x = rng.standard_normal((32, 32)).astype(np.float32)
    qat = _frozen_qat(Sequential(Linear(32, 16), ELU(), Linear(16, 8)), x, qconfig)
    path = to_onnx(qat, tmp_path / "m.onnx", input_shape=(32,))
    want = convert(qat)(x)
    for optimize in (False, True):
        got = ort_session(onnx.load(path), optimize=optimize).run(None, {"input": x})[0]
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-5)


class Doubled(Module):
    """A user's layer with no emitter registered."""

    def forward(self, x):
        return 2 * x

    def backward(self, dy):
        return 2 * dy


@pytest.mark.parametrize(
    ("shape", "error", "match"),
    [
        (None, TypeError, "input_shape"),
        ((7,), ValueError, r"input_shape \(7,\) does not fit the model"),
        ((0,), ValueError, "sizes >= 1"),
        ("6", TypeError, "tuple of ints"),
    ],
)
def test_bad_input_shapes_are_refused_and_nothing_is_written(rng, tmp_path, shape, error, match):
    x = rng.standard_normal((16, 6)).astype(np.float32)
    qat = _frozen_qat(Sequential(Linear(6, 4), ELU()), x)
    with pytest.raises(error, match=match):
        to_onnx(qat, tmp_path / "m.onnx", input_shape=shape)
    assert list(tmp_path.iterdir()) == []


def test_a_layer_without_an_emitter_is_named(rng, tmp_path):
    x = rng.standard_normal((16, 6)).astype(np.float32)
    qat = _frozen_qat(Sequential(Linear(6, 4), Doubled()), x)
    with pytest.raises(TypeError, match=r"no ONNX emitter for layer '1' of type Doubled"):
        to_onnx(qat, tmp_path / "m.onnx", input_shape=(6,))
    assert list(tmp_path.iterdir()) == []


def test_a_forecaster_with_an_input_shape_is_refused(rng, tmp_path):
    cfg = SMALL_TFT
    qat = QATTemporalFusionTransformer.from_float(
        TemporalFusionTransformer(cfg, seed=0), config=nbqat.QATConfig(calibration_batches=1)
    )
    qat.calibrate([forecast_batch(rng, cfg, 8)])
    qat.freeze_observers()
    with pytest.raises(TypeError, match="leave input_shape out"):
        to_onnx(qat, tmp_path / "m.onnx", input_shape=(cfg.num_static_features,))
    assert list(tmp_path.iterdir()) == []


class Net(Module):
    """A user's composite: docs/export.md registers its emitter."""

    def __init__(self):
        super().__init__()
        self.body = Sequential(Linear(6, 8), ELU())
        self.head = Linear(8, 3)

    def forward(self, x):
        return self.head(self.body(x))

    def backward(self, dy):
        return self.body.backward(self.head.backward(dy))


def test_the_docs_composite_emitter_exports_a_composite_alone_and_nested(rng, tmp_path):
    """docs/export.md's emitter of a composite (its code block, run here): the composite as
    the model and inside a Sequential, through onnxruntime against ``convert()``."""
    import pathlib
    import re

    from nbqat.export import emitters

    text = (pathlib.Path(__file__).parents[1] / "docs" / "export.md").read_text()
    (code,) = re.findall(r"```python\n([^`]*@register\(Net\)[^`]*)```", text)
    x = rng.standard_normal((16, 6)).astype(np.float32)
    try:
        exec(compile(code, "docs/export.md", "exec"), {"Net": Net})  # noqa: S102
        for i, model in enumerate([Net(), Sequential(Net(), ELU())]):
            qat = _frozen_qat(model, x)
            path = to_onnx(qat, tmp_path / f"m{i}.onnx", input_shape=(6,))
            got = ort_session(onnx.load(path), optimize=False).run(None, {"input": x})[0]
            np.testing.assert_allclose(got, convert(qat)(x), rtol=0, atol=1e-5)
    finally:
        emitters.EMITTERS.pop(Net, None)
