"""Inference of the main job's model: onnxruntime (int8 QDQ) vs nbqat int8 vs nbqat float vs
torch eager float, at batch 1 and 256, and the model's size on disk (int8 vs float32 weights).

The model has the main job's default shape (k=168, tau=24, hidden 16, 4 heads, the shipped
data's 6 static / 12 historical / 4 future inputs; ``SMALL``: k=8, tau=4, hidden 8, batches 1
and 8), calibrated on random inputs and frozen. Every engine runs single-threaded (BLAS,
onnxruntime's intra-op pool and torch limited to one thread: the main job's setting) and the
figures are the median of alternating rounds (``paired_ratio``): ratios ``X_over_ort`` > 1 mean
onnxruntime is faster. Sizes: the ONNX file as exported (int8 weight initializers) and the same
graph with every weight DequantizeLinear replaced by its float32 result, and the quantized
weights alone (codes + scales + zero points, against 4 bytes a weight): the unrolled LSTMs make
the graph itself (nodes, names) most of the file at this small width.
"""

from __future__ import annotations

import os
import sys
import tempfile

import numpy as np
from _roof import paired_ratio, report
from conftest import SMALL

HERE = os.path.dirname(os.path.abspath(__file__))
MS, MZ, MX = 6, 12, 4
K, TAU, D, HEADS = (8, 4, 8, 2) if SMALL else (168, 24, 16, 4)
BATCHES = (1, 8) if SMALL else (1, 256)
ROUNDS = 3 if SMALL else 11


def _model():
    from nbqat.nn import TemporalFusionTransformer, TFTConfig
    from nbqat.nn.qat import QATTemporalFusionTransformer
    from nbqat.quantization.qconfig import QATConfig

    cfg = TFTConfig(MS, MX, MZ, D, K, TAU, num_heads=HEADS)
    fm = TemporalFusionTransformer(cfg, seed=0)
    q = QATTemporalFusionTransformer.from_float(fm, config=QATConfig(calibration_batches=2))
    rng = np.random.default_rng(0)
    q.calibrate([_inputs(rng, 32) for _ in range(2)])
    q.freeze_observers()
    return fm, q


def _inputs(rng, b):
    return (
        rng.normal(size=(b, MS)).astype(np.float32),
        rng.normal(size=(b, K, MZ)).astype(np.float32),
        rng.normal(size=(b, TAU, MX)).astype(np.float32),
    )


def _weight_bytes(proto) -> tuple[int, int]:
    """Bytes of the quantized weights as stored (int8 codes + per-channel scales + zero points)
    and as float32."""
    inits = {i.name: i for i in proto.graph.initializer}
    q8 = f32 = 0
    for node in proto.graph.node:
        if node.op_type == "DequantizeLinear" and node.input[0] in inits:
            q8 += sum(len(inits[n].raw_data) for n in node.input)
            f32 += 4 * int(np.prod(inits[node.input[0]].dims))
    return q8, f32


def _float_weights(proto):
    """The same graph with float32 weight initializers (each weight DQ folded)."""
    import onnx
    from onnx import numpy_helper

    m = onnx.ModelProto()
    m.CopyFrom(proto)
    inits = {i.name: i for i in m.graph.initializer}
    keep, drop = [], set()
    for node in m.graph.node:
        if node.op_type == "DequantizeLinear" and node.input[0] in inits:
            q, s, z = (numpy_helper.to_array(inits[n]) for n in node.input)
            w = ((q.astype(np.float32) - z.astype(np.float32)) * s).astype(np.float32)
            m.graph.initializer.append(numpy_helper.from_array(w, node.output[0]))
            drop.update(node.input)
        else:
            keep.append(node)
    del m.graph.node[:]
    m.graph.node.extend(keep)
    kept = [i for i in m.graph.initializer if i.name not in drop]
    del m.graph.initializer[:]
    m.graph.initializer.extend(kept)
    return m


def _time_batch(b, inputs, sess, int8, fm, ref, torch) -> dict[str, float]:
    """Paired timings of each engine against onnxruntime at batch ``b``."""
    s, h, f = inputs
    feed = {"static": s, "historical": h, "future": f}
    ts, th, tf = (torch.from_numpy(a) for a in (s, h, f))
    engines = {
        "nbqat_int8": lambda: int8.forward(s, h, f),
        "nbqat_float": lambda: fm.forward(s, h, f),
        "torch_float": lambda: ref(ts, th, tf),
    }
    out: dict[str, float] = {}
    ort_ms = []
    for name, fn in engines.items():
        r, _, _, t_other, t_ort = paired_ratio(fn, lambda: sess.run(None, feed), rounds=ROUNDS)
        out[f"b{b}_{name}_over_ort"] = r
        out[f"b{b}_{name}_ms"] = 1e3 * t_other
        ort_ms.append(1e3 * t_ort)
    out[f"b{b}_ort_ms"] = float(np.median(ort_ms))
    np.testing.assert_allclose(
        sess.run(None, feed)[0], int8.forward(s, h, f), atol=2 * float(int8.output_scale)
    )
    return out


def test_export_inference(benchmark):
    import torch
    from threadpoolctl import threadpool_limits

    sys.path.insert(0, os.path.join(HERE, "..", "tests"))
    from ref_tft_torch import make_torch_tft

    from nbqat.export import to_onnx
    from nbqat.export.parity import ort_session

    torch.set_num_threads(1)
    fm, q = _model()
    int8 = q.to_int8()
    ref = make_torch_tft(torch, fm.config, fm.state_dict(), torch.float32).eval()
    with tempfile.TemporaryDirectory() as tmp:
        path = to_onnx(q, os.path.join(tmp, "model.onnx"))
        int8_bytes = os.path.getsize(path)
        import onnx

        proto = onnx.load(str(path))
    float_bytes = len(_float_weights(proto).SerializeToString())
    sess = ort_session(proto, optimize=True)
    figures: dict[str, float] = {"onnx_int8_bytes": int8_bytes, "onnx_float32_bytes": float_bytes}
    figures["size_ratio_float32_over_int8"] = float_bytes / int8_bytes
    q8, f32 = _weight_bytes(proto)
    figures.update(weights_int8_bytes=q8, weights_float32_bytes=f32)
    figures["weights_ratio_float32_over_int8"] = f32 / q8
    rng = np.random.default_rng(1)
    with threadpool_limits(limits=1, user_api="blas"), torch.no_grad():
        for b in BATCHES:
            figures.update(_time_batch(b, _inputs(rng, b), sess, int8, fm, ref, torch))
        s, h, f = _inputs(rng, BATCHES[-1])
        feed = {"static": s, "historical": h, "future": f}
        benchmark(lambda: sess.run(None, feed))
    report(benchmark, **figures)
