"""ONNX QDQ export (nbqat.export): graph structure, parity against nbqat and onnxruntime, errors.

Oracles: the nbqat int8 and fake-quant models (themselves tested against PyTorch), onnxruntime
and onnx.reference as independent runtimes of the exported graph, and PyTorch's
``fake_quantize_per_channel_affine`` / ``fake_quantize_per_tensor_affine`` for the weights and
the tie rounding.
"""

from __future__ import annotations

import json
import os

import numpy as np
import onnx
import pytest
from onnx import numpy_helper
from tolerances import q_risk_bound

from nbqat import QATConfig, QConfig
from nbqat.export import check_parity, division_study, to_onnx
from nbqat.export.onnx_export import build_model
from nbqat.export.parity import ort_session
from nbqat.nn import TemporalFusionTransformer, TFTConfig
from nbqat.nn.qat import QATTemporalFusionTransformer
from nbqat.quantization.qconfig import default_qat_qconfig

K, TAU, MS, MX, MZ = 5, 3, 2, 2, 3


def _cfg(**kw):
    base = dict(
        num_static_features=MS,
        num_known_features=MX,
        num_unknown_features=MZ,
        hidden_dim=8,
        sequence_length=K,
        prediction_horizon=TAU,
        num_heads=2,
    )
    base.update(kw)
    return TFTConfig(**base)


def _batch(rng, n, scale=1.0, steps=K):
    return (
        (scale * rng.standard_normal((n, MS))).astype(np.float32),
        (scale * rng.standard_normal((n, steps, MZ))).astype(np.float32),
        (scale * rng.standard_normal((n, TAU, MX))).astype(np.float32),
    )


def _qat(seed=1, qconfig=None, freeze=True, **qkw):
    m = TemporalFusionTransformer(_cfg(), seed=seed)
    q = QATTemporalFusionTransformer.from_float(
        m, qconfig=qconfig, config=QATConfig(calibration_batches=2, **qkw)
    )
    rng = np.random.default_rng(seed)
    q.calibrate([_batch(rng, 16) for _ in range(2)])
    if freeze:
        q.freeze_observers()
    return q


@pytest.fixture(scope="module")
def qat_head():
    return _qat(quantize_output_head=True)


@pytest.fixture(scope="module")
def qat_float_head():
    return _qat(seed=2)


def _codes(y, int8):
    return np.rint(y / int8.output_scale).astype(np.int64) + int8.output_zero_point


# ----------------------------------------------------------------------------- parity
def test_parity_random_quantized_head_codes(qat_head, tmp_path, rng):
    path = to_onnx(qat_head, tmp_path / "m.onnx")
    s, h, f = _batch(rng, 48)
    rep = check_parity(qat_head, path, s, h, f, reference_rows=None)
    preds = rep["_predictions"]
    int8 = qat_head.to_int8()
    ref_codes = _codes(preds["int8"], int8)
    for eng in ("ort_disable_all", "ort_default", "reference", "fake_quant"):
        codes = _codes(preds[eng], int8)
        assert np.max(np.abs(codes - ref_codes)) <= 1, eng
        assert np.mean(codes == ref_codes) >= 0.99, eng
    assert rep["pairs"]["int8_vs_ort_default"]["max_diff_output_steps"] <= 1.0 + 1e-6


@pytest.mark.parametrize("n", [1, 300])
def test_parity_batch_sizes(qat_float_head, tmp_path, rng, n):
    path = to_onnx(qat_float_head, tmp_path / "m.onnx")
    s, h, f = _batch(rng, n)
    rep = check_parity(qat_float_head, path, s, h, f, reference_rows=2)
    assert rep["engines"]["ort_default"]["rows"] == n
    for key in ("int8_vs_ort_disable_all", "int8_vs_ort_default", "int8_vs_reference"):
        assert rep["pairs"][key]["max_diff_output_steps"] <= 1.0, key
    # the unfused graph does the fake-quant model's float arithmetic: far below one step
    assert rep["pairs"]["fake_quant_vs_ort_disable_all"]["max_diff_output_steps"] < 0.05


def test_parity_of_a_qat_model_left_in_training_mode_drops_nothing(tmp_path, rng):
    """A QAT TFT with dropout left in training mode (``qat.train()`` after training): its
    ``predict``, check_parity's ``fake_quant`` engine, applied dropout masks (0.83 from
    onnxruntime and from the int8 model, where Dropout is the identity). ``predict`` is an
    evaluation: within a small fraction of an output step of onnxruntime's unfused graph."""
    q = QATTemporalFusionTransformer.from_float(
        TemporalFusionTransformer(_cfg(dropout=0.3), seed=1),
        config=QATConfig(calibration_batches=2),
    )
    q.calibrate([_batch(rng, 16) for _ in range(2)])
    q.freeze_observers()
    q.train()
    drops = [m for m in q.model.modules() if type(m).__name__ == "Dropout"]
    assert drops and all(m.active() for m in drops)
    path = to_onnx(q, tmp_path / "m.onnx")
    rep = check_parity(q, path, *_batch(rng, 8), reference_rows=0)
    assert rep["pairs"]["fake_quant_vs_ort_disable_all"]["max_diff_output_steps"] < 0.05
    assert all(m.active() for m in drops)  # the model's mode is left as it was


def test_parity_saturated_activations(qat_float_head, tmp_path, rng):
    """Inputs 50x the calibration range drive many quantizers into quant_min / quant_max."""
    path = to_onnx(qat_float_head, tmp_path / "m.onnx")
    s, h, f = _batch(rng, 32, scale=50.0)
    rep = check_parity(qat_float_head, path, s, h, f, reference_rows=4)
    for key in ("int8_vs_ort_disable_all", "int8_vs_ort_default", "int8_vs_reference"):
        assert rep["pairs"][key]["max_diff_output_steps"] <= 1.0, key
    d = division_study(path, s, h, f)
    assert d["runtime_vs_division"] == 0  # onnxruntime's QuantizeLinear divides


@pytest.mark.parametrize("scale", [1e20, 1e30])
def test_parity_inputs_far_beyond_float32_squares(qat_head, tmp_path, scale):
    """Inputs of 1e20 and 1e30 (squares beyond float32): a variable GRN's LayerNorm sees the
    raw embedding through its skip, its sum of squares overflows in nbqat and in onnxruntime,
    and both give the bias (rstd 0); nbqat's gave NaN rows (143 output steps from onnxruntime
    at 1e20). The bound, docs/export.md: a LayerNorm row's plain sum must stay finite."""
    path = to_onnx(qat_head, tmp_path / "m.onnx")
    s, h, f = _batch(np.random.default_rng(0), 8, scale=scale)
    rep = check_parity(qat_head, path, s, h, f, reference_rows=0)
    assert rep["pairs"]["int8_vs_ort_disable_all"]["max_diff_output_steps"] == 0.0
    # the fused integer kernels: one output step at most (measured 1.0000024 steps at 1e20)
    assert rep["pairs"]["int8_vs_ort_default"]["max_diff_output_steps"] < 1.0 + 1e-5
    assert rep["pairs"]["fake_quant_vs_int8"]["max_diff_output_steps"] == 0.0


def test_parity_real_windows_qrisk(tmp_path):
    from nbqat.data import load_tmy3, make_windows
    from nbqat.train import q_risk

    w = make_windows(load_tmy3(), history=12, horizon=4, eval_stride=97, season=12)
    cfg = TFTConfig(
        num_static_features=w.static.shape[1],
        num_known_features=w.future_features.shape[1],
        num_unknown_features=w.hist_features.shape[1],
        hidden_dim=8,
        sequence_length=12,
        prediction_horizon=4,
        num_heads=2,
    )
    q = QATTemporalFusionTransformer.from_float(
        TemporalFusionTransformer(cfg, seed=3), config=QATConfig(calibration_batches=3)
    )
    tr = w.train
    q.calibrate([tr.batch(np.arange(i * 32, (i + 1) * 32)) for i in range(3)])
    q.freeze_observers()
    path = to_onnx(q, tmp_path / "m.onnx", metadata={"feature_names": w.static_names})
    test = w.test
    s, h, f, _ = test.batch()
    y = test.target_raw()
    rep = check_parity(q, path, s, h, f, target=y, unscale=test.unscale, reference_rows=3)
    eng = rep["engines"]
    for key in ("int8_vs_ort_disable_all", "int8_vs_ort_default"):
        assert rep["pairs"][key]["max_diff_output_steps"] <= 1.0, key
    # onnxruntime's q-risk within what its predictions' distance from int8's allows (the
    # pinball loss is 1-Lipschitz: tolerances.q_risk_bound; a 4-significant-digit match can flip
    # at a rounding boundary), and the harness's q-risk is train.q_risk's
    quantiles = q.model.config.quantiles
    preds = rep["_predictions"]

    def bound_of(pa, pb):  # the first rows of the split (reference evaluators run on 3)
        rows = np.arange(len(pa))
        un = test.unscale
        return q_risk_bound(un(pa, rows), un(pb, rows), y[: len(pa)], quantiles)

    ref = q_risk(test.unscale(preds["int8"]), y, quantiles)
    for name in ("ort_disable_all", "ort_default"):
        bound = bound_of(preds[name], preds["int8"])
        for k, v in eng[name]["q_risk"].items():
            assert abs(v - ref[k]) <= bound[k], (name, k)
    assert eng["int8"]["q_risk"] == ref
    props = {p.key: p.value for p in onnx.load(str(path)).metadata_props}
    assert json.loads(props["feature_names"]) == w.static_names
    # the split read batch by batch (batches smaller than the split) gives the same report
    streamed = check_parity(
        q, path, test, target=y, unscale=test.unscale, reference_rows=3, batch_size=5
    )
    # batches of 5 rows and the whole split take different BLAS kernels (numpy matmul in the
    # fake-quant model's float layers; onnxruntime's own): another summation order, so the
    # predictions agree to rounding, or, where a rounding boundary of a fake-quant node flips,
    # to one output quantization step (the harness's unit, output_scale)
    step = rep["output_scale"]
    for name, p in rep["_predictions"].items():
        sp = streamed["_predictions"][name]
        np.testing.assert_allclose(sp, p, rtol=0, atol=step, err_msg=name)
        bound = bound_of(sp, p)
        for k, v in streamed["engines"][name]["q_risk"].items():
            assert abs(v - rep["engines"][name]["q_risk"][k]) <= bound[k], (name, k)
    assert streamed["engines"].keys() == rep["engines"].keys()
    assert streamed["pairs"].keys() == rep["pairs"].keys()
    for key, pair in rep["pairs"].items():  # each side moved by at most one step
        assert abs(streamed["pairs"][key]["max_abs_diff"] - pair["max_abs_diff"]) <= 2 * step
    assert division_study(path, test, batch_size=5) == division_study(path, s, h, f)
    with pytest.raises(TypeError, match="three input arrays"):
        check_parity(q, path, s, h)


def test_parity_refuses_bad_batching_and_no_windows(qat_float_head, tmp_path, rng):
    # batch_size 0 raised range()'s message, -1 an empty report from division_study ("0 codes
    # differ") and np.concatenate's error from check_parity; no windows the same.
    path = to_onnx(qat_float_head, tmp_path / "m.onnx")
    s, h, f = _batch(rng, 3)
    for bs in (0, -1):
        with pytest.raises(ValueError, match="`batch_size` must be >= 1"):
            check_parity(qat_float_head, path, s, h, f, batch_size=bs)
        with pytest.raises(ValueError, match="`batch_size` must be >= 1"):
            division_study(path, s, h, f, batch_size=bs)
    with pytest.raises(TypeError, match="`batch_size` must be an integer"):
        division_study(path, s, h, f, batch_size=2.5)
    with pytest.raises(ValueError, match="`reference_rows` must be >= 0"):
        check_parity(qat_float_head, path, s, h, f, reference_rows=-1)
    with pytest.raises(ValueError, match="no windows"):
        check_parity(qat_float_head, path, s[:0], h[:0], f[:0])
    with pytest.raises(ValueError, match="no windows"):
        division_study(path, s[:0], h[:0], f[:0])
    # batches of 2 over 3 rows: the same codes as one batch (the oracle: the whole batch)
    assert division_study(path, s, h, f, batch_size=2) == division_study(path, s, h, f)


# ----------------------------------------------------------------------------- structure
def test_graph_checker_metadata_and_io(qat_float_head, tmp_path):
    path = to_onnx(qat_float_head, tmp_path / "m.onnx")
    m = onnx.load(str(path))
    onnx.checker.check_model(m, full_check=True)
    assert [i.name for i in m.graph.input] == ["static", "historical", "future"]
    assert [o.name for o in m.graph.output] == ["quantiles"]
    dims = [d.dim_param or d.dim_value for d in m.graph.output[0].type.tensor_type.shape.dim]
    assert dims == ["batch", TAU, 3]
    props = {p.key: p.value for p in m.metadata_props}
    assert json.loads(props["quantiles"]) == [0.1, 0.5, 0.9]
    assert props["nbqat_version"] and props["lstm"] == "unrolled"
    # the hidden-state quantizer: one Q/DQ per LSTM step (k encoder + tau decoder steps)
    hidden_q = [n for n in m.graph.node if n.op_type == "QuantizeLinear" and ".hidden." in n.name]
    assert len(hidden_q) == K + TAU
    # a float head: no output quantizer
    assert not any("output.Q" in n.name for n in m.graph.node)


def test_weights_per_channel_match_torch(qat_float_head, tmp_path, torch):
    """Every weight initializer is int8 with a per-axis DQ (axis 1 of the (K, N) operand) and
    dequantizes to torch.fake_quantize_per_channel_affine of the QAT shadow weight."""
    path = to_onnx(qat_float_head, tmp_path / "m.onnx")
    m = onnx.load(str(path))
    inits = {i.name: numpy_helper.to_array(i) for i in m.graph.initializer}
    dq = [n for n in m.graph.node if n.op_type == "DequantizeLinear" and n.input[0] in inits]
    mods = dict(qat_float_head.model.named_modules())
    seen = 0
    for node in dq:
        codes = inits[node.input[0]]
        axis = {a.name: a.i for a in node.attribute}["axis"]
        assert codes.dtype == np.int8 and axis == 1
        layer = node.input[0].rsplit(".weight_q", 1)[0]
        owner, attr = layer, "weight"
        if layer.endswith((".ih", ".hh")):
            owner, attr = layer[:-3], "weight_" + layer[-2:]
        mod = mods[owner]
        fq = getattr(mod, attr + "_fake_quant")
        w = torch.from_numpy(getattr(mod, attr).copy())
        ref = torch.fake_quantize_per_channel_affine(
            w,
            torch.from_numpy(np.asarray(fq.scale, np.float32)),
            torch.from_numpy(np.asarray(fq.zero_point).astype(np.int32)),
            0,
            int(fq.quant_min),
            int(fq.quant_max),
        ).numpy()
        scale, zp = inits[node.input[1]], inits[node.input[2]]
        got = (codes.astype(np.float32) - zp.astype(np.float32)) * scale
        np.testing.assert_array_equal(got.T, ref)
        seen += 1
    assert seen == len(qat_float_head.to_int8().layers) + 2  # LSTMs have two weights each


def test_ties_round_half_to_even_like_torch(torch):
    """QuantizeLinear at exact ties (x = (n + 1/2) * scale, scale a power of two so that both
    x / scale and x * (1 / scale) are exact) rounds half to even, as fake quant does."""
    from onnx import TensorProto, helper

    from nbqat.export._graph import GraphBuilder, QParams

    g = GraphBuilder(21, {})
    g.fresh("x")
    qp = QParams("t", np.float32(0.25), 10, 0, 127)
    y = g.qdq("x", qp, "t")
    g.nodes.append(helper.make_node("Identity", [y], ["y"]))
    graph = helper.make_graph(
        g.nodes,
        "t",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None])],
        initializer=g.initializers,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    model.ir_version = 10
    onnx.checker.check_model(model, full_check=True)
    assert any(n.op_type == "Clip" for n in model.graph.node)  # [0, 127] in uint8
    x = ((np.arange(-60, 140) + 0.5) * 0.25 - 2.5).astype(np.float32)
    got = ort_session(model, optimize=False).run(None, {"x": x})[0]
    ref = torch.fake_quantize_per_tensor_affine(torch.from_numpy(x), 0.25, 10, 0, 127).numpy()
    np.testing.assert_array_equal(got, ref)


def test_reduced_range_gets_clip_and_parity(tmp_path, rng):
    act = default_qat_qconfig.activation.with_args(quant_max=127)  # [0, 127] quint8
    q = _qat(seed=4, qconfig=QConfig(activation=act, weight=default_qat_qconfig.weight))
    proto, _ = build_model(q)
    n_q = sum(n.op_type == "QuantizeLinear" for n in proto.graph.node)
    n_clip = sum(n.op_type == "Clip" for n in proto.graph.node)
    assert n_clip == n_q > 0
    path = to_onnx(q, tmp_path / "m.onnx")
    s, h, f = _batch(rng, 16, scale=5.0)
    rep = check_parity(q, path, s, h, f, reference_rows=2)
    for key in ("int8_vs_ort_disable_all", "int8_vs_ort_default", "int8_vs_reference"):
        assert rep["pairs"][key]["max_diff_output_steps"] <= 1.0, key


def test_int8_model_and_qat_give_the_same_file(qat_float_head, tmp_path):
    a = to_onnx(qat_float_head, tmp_path / "a.onnx").read_bytes()
    b = to_onnx(qat_float_head.to_int8(), tmp_path / "b.onnx").read_bytes()
    ma, mb = onnx.load_from_string(a), onnx.load_from_string(b)
    assert ma.graph == mb.graph


def test_opset_13_decomposed_layernorm(qat_float_head, tmp_path, rng):
    path = to_onnx(qat_float_head, tmp_path / "m.onnx", opset=13)
    m = onnx.load(str(path))
    assert m.opset_import[0].version == 13
    assert not any(n.op_type == "LayerNormalization" for n in m.graph.node)
    s, h, f = _batch(rng, 8)
    # onnx.reference implements DequantizeLinear from opset 19 on: check_parity's defaults
    # skip it below (they crashed in onnx's evaluator), onnxruntime runs the model
    rep = check_parity(qat_float_head, path, s, h, f)
    assert "reference" not in rep["engines"] and "int8_vs_reference" not in rep["pairs"]
    assert rep["pairs"]["int8_vs_ort_disable_all"]["max_diff_output_steps"] <= 1.0
    with pytest.raises(Exception, match="DequantizeLinear"):  # the evaluator's own refusal
        from onnx.reference import ReferenceEvaluator

        ReferenceEvaluator(m).run(None, {"static": s, "historical": h, "future": f})


# ----------------------------------------------------------------------------- errors
def _nothing_written(folder, name="m.onnx"):
    assert not (folder / name).exists()
    assert os.listdir(folder) == []


def test_error_bad_metadata_before_anything_is_written(qat_float_head, tmp_path):
    """User metadata silently replaced nbqat's own props (``quantiles``, which check_parity
    and the predict engines read), a non-string key failed inside onnx, and NaN was written
    as non-strict JSON."""
    for meta, err, match in (
        ({"quantiles": [0.5]}, ValueError, r"metadata \['quantiles'\] would replace nbqat's"),
        ({1: "x"}, TypeError, "metadata keys must be str, got 1"),
        ({"score": float("nan")}, ValueError, r"metadata\['score'\] is not strict JSON"),
        ([("a", 1)], TypeError, "metadata must be a mapping"),
    ):
        with pytest.raises(err, match=match):
            to_onnx(qat_float_head, tmp_path / "m.onnx", metadata=meta)
        _nothing_written(tmp_path)
    p = to_onnx(qat_float_head, tmp_path / "m.onnx", metadata={"score": 0.25, "note": "ok"})
    props = {q.key: q.value for q in onnx.load(str(p)).metadata_props}
    assert props["score"] == "0.25" and props["note"] == "ok"
    assert json.loads(props["quantiles"]) == list(qat_float_head.model.config.quantiles)


def test_error_uncalibrated_names_quantizer(tmp_path):
    q = QATTemporalFusionTransformer.from_float(TemporalFusionTransformer(_cfg()))
    with pytest.raises(ValueError, match=r"quantizer '.*' is uncalibrated"):
        to_onnx(q, tmp_path / "m.onnx")
    _nothing_written(tmp_path)


def test_error_unfrozen_observer(tmp_path):
    q = _qat(seed=5, freeze=False)
    with pytest.raises(ValueError, match=r"observer of quantizer '.+' is not frozen"):
        to_onnx(q, tmp_path / "m.onnx")
    _nothing_written(tmp_path)


def test_error_calibration_phase(tmp_path, qat_float_head):
    q = _qat(seed=6)
    q.enable_calibration()
    with pytest.raises(ValueError, match="calibration phase"):
        to_onnx(q, tmp_path / "m.onnx")
    _nothing_written(tmp_path)


def test_error_unrepresentable_range(tmp_path):
    act = default_qat_qconfig.activation.with_args(quant_min=-1000, quant_max=1000, dtype="qint16")
    q = _qat(seed=7, qconfig=QConfig(activation=act, weight=default_qat_qconfig.weight))
    with pytest.raises(ValueError, match=r"\[-1000, 1000\].*opset 13"):
        to_onnx(q, tmp_path / "m.onnx", opset=13)
    _nothing_written(tmp_path)
    assert not any(p.is_file() for p in tmp_path.iterdir())
    # opset 21 has int16: the same model exports, the range clamped by a float Clip before each
    # QuantizeLinear (onnxruntime has no int16 Clip), and runs within one step unoptimised
    path = to_onnx(q, tmp_path / "m.onnx", opset=21)
    nodes = onnx.load(str(path)).graph.node
    n_q = sum(n.op_type == "QuantizeLinear" for n in nodes)
    assert sum(n.op_type == "Clip" for n in nodes) == n_q > 0
    s, h, f = _batch(np.random.default_rng(0), 8, scale=5.0)
    rep = check_parity(q, path, s, h, f, reference_rows=2)
    for key in ("int8_vs_ort_disable_all", "int8_vs_reference", "fake_quant_vs_int8"):
        assert rep["pairs"][key]["max_diff_output_steps"] <= 1.0, key


def test_error_missing_folder_and_bad_args(tmp_path, qat_float_head):
    with pytest.raises(ValueError, match="does not exist"):
        to_onnx(qat_float_head, tmp_path / "nope" / "m.onnx")
    assert not (tmp_path / "nope").exists()
    with pytest.raises(ValueError, match="opset"):
        to_onnx(qat_float_head, tmp_path / "m.onnx", opset=12)
    with pytest.raises(TypeError, match="QATTemporalFusionTransformer"):
        to_onnx(qat_float_head.model, tmp_path / "m.onnx")
    with pytest.raises(ValueError, match="is a folder"):
        to_onnx(qat_float_head, tmp_path)
    _nothing_written(tmp_path)


def test_atomic_overwrite_keeps_old_file_on_error(tmp_path, qat_float_head):
    path = to_onnx(qat_float_head, tmp_path / "m.onnx")
    before = path.read_bytes()
    q = QATTemporalFusionTransformer.from_float(TemporalFusionTransformer(_cfg()))
    with pytest.raises(ValueError):
        to_onnx(q, path)
    assert path.read_bytes() == before
    assert os.listdir(tmp_path) == ["m.onnx"]


def test_check_parity_bad_inputs(qat_float_head, tmp_path, rng):
    path = to_onnx(qat_float_head, tmp_path / "m.onnx")
    s, h, f = _batch(rng, 4)
    with pytest.raises(ValueError, match="batch size"):
        check_parity(qat_float_head, path, s[:3], h, f)
    with pytest.raises(ValueError, match="target must have shape"):
        check_parity(qat_float_head, path, s, h, f, target=np.zeros((4, TAU + 1)))
    with pytest.raises(TypeError, match="onnx_model"):
        check_parity(qat_float_head, 3, s, h, f)


@pytest.mark.parametrize("skip_steps", [None, K + 4, K - 2], ids=["k", "longer", "shorter"])
def test_linear_skip_parity(tmp_path, rng, skip_steps):
    """The skip reading its own history (``skip_sequence_length``): the graph's historical
    input has ``max(k, k_s)`` steps and its two Slices must match the model's forward."""
    m = TemporalFusionTransformer(_cfg(linear_skip=True, skip_sequence_length=skip_steps), seed=8)
    n_in = m.config.input_length
    q = QATTemporalFusionTransformer.from_float(m, config=QATConfig(calibration_batches=2))
    q.calibrate([_batch(rng, 16, steps=n_in) for _ in range(2)])
    q.freeze_observers()
    path = to_onnx(q, tmp_path / "m.onnx")
    s, h, f = _batch(rng, 16, steps=n_in)
    rep = check_parity(q, path, s, h, f, reference_rows=2)
    for key in ("int8_vs_ort_disable_all", "int8_vs_ort_default", "int8_vs_reference"):
        assert rep["pairs"][key]["max_diff_output_steps"] <= 1.0, key
    g = onnx.load(str(path)).graph
    assert any("linear_skip" in n.name for n in g.node)
    dims = [d.dim_value for d in g.input[1].type.tensor_type.shape.dim[1:]]
    assert (g.input[1].name, dims) == ("historical", [max(K, skip_steps or K), MZ])
    # the steps before the body's k reach only the skip: changing them moves the output by the
    # skip's weights on them, and not at all without a longer skip
    h2 = h.copy()
    h2[:, : n_in - K] += 1.0
    moved = not np.array_equal(q.predict(s, h2, f), q.predict(s, h, f))
    assert moved == (n_in > K)


def test_linear_skip_emitter_against_numpy(tmp_path, rng):
    """The skip emitter on a stand-in: a float Linear attached to the int8 model's network as
    issue 19 specifies (``config.linear_skip``, ``tft.linear_skip``); oracle: the int8 forward
    plus the skip computed in NumPy."""
    from nbqat.nn.layers import Linear
    from nbqat.nn.params import ParameterBuffer

    int8 = _qat(seed=9).to_int8()
    s, h, f = _batch(rng, 5)
    base = int8.forward(s, h, f)  # before the skip is attached
    n_in, n_out = K * MZ + TAU * MX + MS, TAU * 3
    lin = Linear(n_in, n_out)
    ParameterBuffer(lin, np.dtype(np.float32), 0)
    int8.model.config.linear_skip = True
    int8.model.linear_skip = lin
    path = to_onnx(int8, tmp_path / "m.onnx")
    got = ort_session(onnx.load(str(path)), optimize=False).run(
        None, {"static": s, "historical": h, "future": f}
    )[0]
    flat = np.concatenate([h.reshape(5, -1), f.reshape(5, -1), s], axis=1)
    skip = (flat.astype(np.float64) @ lin.weight.T + lin.bias).reshape(5, TAU, 3)
    ref = base + skip
    np.testing.assert_allclose(got, ref, atol=float(int8.output_scale))
    assert np.max(np.abs(got - ref)) < 1e-4


def test_division_study_counts_against_exact_rounding():
    """A one-quantizer graph on ``static``: the study's counts against codes computed from the
    exact quotient (float64 of two float32 values, then round half to even), on values chosen
    so that ``x * float32(1 / s)`` and ``x / s`` round differently."""
    from onnx import TensorProto, helper

    from nbqat.export._graph import GraphBuilder, QParams

    s = np.float32(0.1)
    inv = np.float32(1) / s
    base = ((np.arange(127) + 0.5) * s).astype(np.float32)  # near the ties k + 1/2
    x = np.concatenate([base + np.float32(j) * np.spacing(base) for j in range(-3, 4)])
    keep = np.rint(x / s) == np.rint(x.astype(np.float64) / np.float64(s))
    x = x[keep]  # drop quotients that float32 rounds onto a tie
    exact = np.rint(x.astype(np.float64) / np.float64(s))
    recip = np.rint(x * inv)
    assert np.count_nonzero(recip != exact) > 0  # the set holds differing values
    g = GraphBuilder(21, {})
    for n in ("static", "historical", "future"):
        g.fresh(n)
    y = g.qdq("static", QParams("t", s, 0, 0, 255), "t")
    g.nodes.append(helper.make_node("Identity", [y], ["quantiles"]))
    vi = helper.make_tensor_value_info
    graph = helper.make_graph(
        g.nodes,
        "t",
        [vi(n, TensorProto.FLOAT, [None, 1]) for n in ("static",)]
        + [vi(n, TensorProto.FLOAT, [None, 1, 1]) for n in ("historical", "future")],
        [vi("quantiles", TensorProto.FLOAT, [None, 1])],
        initializer=g.initializers,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    model.ir_version = 10
    z = np.zeros((x.size, 1, 1), np.float32)
    d = division_study(model, x[:, None], z, z, batch_size=256)
    assert d["codes"] == x.size and d["quantizers"] == 1
    assert d["runtime_vs_division"] == 0
    assert d["runtime_vs_reciprocal"] == np.count_nonzero(recip != exact)
    assert d["max_code_diff"] == 1


def test_error_bad_scale_or_zero_point(tmp_path):
    int8 = _qat(seed=10).to_int8()
    name, lin = next(iter(int8.layers.items()))
    lin = getattr(lin, "ih", lin)
    good = lin.input_scale
    lin.input_scale = np.float32(0.0)
    with pytest.raises(ValueError, match="non-positive or non-finite scale"):
        to_onnx(int8, tmp_path / "m.onnx")
    lin.input_scale = good
    lin.input_zero_point = 300
    with pytest.raises(ValueError, match=r"zero point \[300\] outside \[0, 255\]"):
        to_onnx(int8, tmp_path / "m.onnx")
    _nothing_written(tmp_path)


def test_parity_learnable_scales_after_a_step(tmp_path, rng):
    """LSQ quantizers (LearnableFakeQuantize): the learned scale and the rounded zero point of
    ``calculate_qparams`` are exported; one QAT step moves them off the observed values."""
    from nbqat import Adam

    q = _qat(seed=11, freeze=False, learnable_scales=True)
    s, h, f = _batch(rng, 8)
    q.train_step((s, h, f, rng.standard_normal((8, TAU)).astype(np.float32)), Adam(q.params, 1e-2))
    q.freeze_observers()
    path = to_onnx(q, tmp_path / "m.onnx")
    rep = check_parity(q, path, s, h, f, reference_rows=2)
    for key in ("int8_vs_ort_disable_all", "int8_vs_ort_default", "fake_quant_vs_ort_disable_all"):
        assert rep["pairs"][key]["max_diff_output_steps"] <= 1.0, key


# ----------------------------------------------------------------------------- generic QAT API
@pytest.mark.parametrize("head_float", [False, True])
def test_prepare_qat_lstm_forecaster_parity(tmp_path, rng, head_float):
    """A model of the generic API (prepare_qat -> calibrate -> freeze) exports through its
    emitter; every ONNX runtime is within float rounding of nbqat's convert() model."""
    from nbqat.nn import LSTMForecaster, LSTMForecasterConfig, convert, prepare_qat

    cfg = LSTMForecasterConfig(MS, MX, MZ, 8, K, TAU)
    mapping = {"head": None} if head_float else None
    q = prepare_qat(LSTMForecaster(cfg, seed=12), qconfig_mapping=mapping)
    for _ in range(2):
        q(*_batch(rng, 16))
    q.disable_calibration()
    with pytest.raises(ValueError, match="not frozen"):
        to_onnx(q, tmp_path / "m.onnx")
    q.freeze_observers()
    path = to_onnx(q, tmp_path / "m.onnx")
    m = onnx.load(str(path))
    props = {p.key: p.value for p in m.metadata_props}
    assert props["source"] == "prepare_qat" and "output_scale" not in props
    hidden_q = [n for n in m.graph.node if n.op_type == "QuantizeLinear" and ".hidden." in n.name]
    assert len(hidden_q) == K
    s, h, f = _batch(rng, 20)
    rep = check_parity(q, path, s, h, f, reference_rows=4)
    int8 = convert(q)
    np.testing.assert_array_equal(rep["_predictions"]["int8"], int8(s, h, f))
    for key in ("int8_vs_ort_disable_all", "int8_vs_ort_default", "int8_vs_reference"):
        p = rep["pairs"][key]
        assert p["max_abs_diff"] < 1e-4 and p["max_diff_output_steps"] is None, key
    assert to_onnx(int8, tmp_path / "b.onnx").read_bytes() != b""


def test_error_network_that_is_not_a_forecaster(tmp_path, rng):
    """prepare_qat(Sequential(...)) (the generic API's own example) is not exportable: a
    TypeError naming the type and the fix, nothing written (was an AttributeError 'config')."""
    from nbqat.nn import ELU, Linear, ParameterBuffer, Sequential, convert, prepare_qat

    net = Sequential(Linear(6, 4), ELU(), Linear(4, 3))
    ParameterBuffer(net, seed=0)
    q = prepare_qat(net)
    q(rng.standard_normal((8, 6)).astype(np.float32))
    q.disable_calibration()
    q.freeze_observers()
    for model in (q, convert(q)):
        with pytest.raises(TypeError, match="Sequential.*nbqat.export.emitters.register"):
            to_onnx(model, tmp_path / "m.onnx")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("skip", [False, True], ids=["plain", "linear_skip"])
def test_empty_batch_runs(tmp_path, rng, skip):
    """A batch of 0 windows (the graph's dynamic batch axis; a server's empty request) gives a
    (0, tau, Q) output in both onnxruntime optimisation levels with the linear skip too (the
    main job's default), as without it: the skip's flattening Reshape (0, -1) failed on it
    ('cannot be reshaped to the requested shape')."""
    m = TemporalFusionTransformer(_cfg(linear_skip=skip), seed=8)
    q = QATTemporalFusionTransformer.from_float(m, config=QATConfig(calibration_batches=2))
    q.calibrate([_batch(rng, 16) for _ in range(2)])
    q.freeze_observers()
    path = to_onnx(q, tmp_path / "m.onnx")
    s, h, f = _batch(rng, 0)
    for optimize in (False, True):
        got = ort_session(onnx.load(str(path)), optimize=optimize).run(
            None, {"static": s, "historical": h, "future": f}
        )[0]
        assert got.shape == (0, TAU, m.config.num_quantiles)


def test_newest_opset_runs_in_onnxruntime_or_is_refused(qat_float_head, tmp_path, rng):
    """``opset=`` the installed onnx's newest: the file runs in onnxruntime, or to_onnx refuses
    it before writing. onnx 1.23 knows opset 28, whose QuantizeLinear onnxruntime 1.32 does not
    implement: to_onnx wrote a file that no session could load ('Could not find an
    implementation for QuantizeLinear(28)')."""
    top = onnx.defs.onnx_opset_version()
    try:
        path = to_onnx(qat_float_head, tmp_path / "m.onnx", opset=top)
    except ValueError as e:
        assert f"cannot run the graph at opset {top}" in str(e) and "onnxruntime" in str(e)
        _nothing_written(tmp_path)
        return
    s, h, f = _batch(rng, 4)
    out = ort_session(onnx.load(str(path)), optimize=False).run(
        None, {"static": s, "historical": h, "future": f}
    )[0]
    assert out.shape == (4, TAU, 3)
