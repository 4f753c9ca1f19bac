"""The tiny data-parallel QAT run shared by tests/mpi_worker.py and tests/test_distributed.py
(the 1-process reference runs the same function with the single-process group)."""

from __future__ import annotations

import numpy as np
from ref_nn import SMALL_TFT as CFG
from ref_nn import forecast_batch

import nbqat
from nbqat import distributed as dist
from nbqat.nn import TemporalFusionTransformer
from nbqat.nn.qat import QATTemporalFusionTransformer

GLOBAL_BATCH = 6


def batch(rng, nb=GLOBAL_BATCH):
    return forecast_batch(rng, CFG, nb)


def tiny_run(group, steps, optimizer=nbqat.SGD, *, rows=GLOBAL_BATCH, learnable=False):
    """Float steps; sharded calibration of a fresh copy; QAT steps (LSQ with ``learnable``) on
    global batches of ``rows`` rows. Returns what every rank (and the 1-process run) must agree
    on."""
    rng = np.random.default_rng(0)
    out = {}
    model = TemporalFusionTransformer(CFG, seed=1)
    cfg = nbqat.QATConfig(learnable_scales=learnable)
    qat = QATTemporalFusionTransformer.from_float(model, config=cfg)  # before any float step
    opt = optimizer(model.params, lr=1e-2)
    losses, norms = [], []
    for _ in range(steps):
        loss, total = dist.data_parallel_step(model, batch(rng, rows), opt, group, max_norm=0.5)
        losses.append(loss)
        norms.append(total)
    out["float_params"] = model.params.copy()
    assert dist.calibrate(qat, [batch(rng, rows) for _ in range(3)], group) == 3
    for name, fq in qat.fake_quants.items():
        out[f"cal.{name}"] = np.concatenate([np.ravel(fq.scale), np.ravel(fq.zero_point)])
    s, h, f, _ = batch(np.random.default_rng(9), 5)
    int8 = qat.to_int8()
    out["int8"] = int8.forward(s, h, f)
    out["int8_step"] = np.float32(int8.output_scale)  # the tests' tolerance unit
    qopt = optimizer(qat.params, lr=1e-2)
    for _ in range(steps):
        loss, total = dist.data_parallel_step(qat, batch(rng, rows), qopt, group, max_norm=0.5)
        losses.append(loss)
        norms.append(total)
    out["loss"] = np.array(losses)
    out["norm"] = np.array(norms)
    out["params"] = qat.params.copy()
    return out


def dropout_run(group, steps=3):
    """SGD steps of a tiny TFT whose dropout is active, through the public
    :func:`nbqat.distributed.data_parallel_step` alone (no main job setting ``Dropout.rows``).
    Returns the losses, norms and final parameters."""
    from dataclasses import replace

    from nbqat.nn import set_dropout

    cfg = replace(CFG, dropout=0.3)
    rng = np.random.default_rng(0)
    model = TemporalFusionTransformer(cfg, seed=1)
    opt = nbqat.SGD(model.params, lr=1e-2)
    losses, norms = [], []
    for step in range(steps):
        set_dropout(model, True, (0, step))
        loss, total = dist.data_parallel_step(model, batch(rng), opt, group, max_norm=10.0)
        losses.append(loss)
        norms.append(total)
    return {"loss": np.array(losses), "norm": np.array(norms), "params": model.params.copy()}


def float8_run(group):
    """:func:`nbqat.distributed.calibrate` of an MLP with ``float8_qconfig()`` (float8
    activations: a dynamic per-tensor scale per batch) on global batches of 7 rows, then the
    frozen model's output. Returns every quantizer's scale and the output."""
    from nbqat.nn import ELU, Linear, ParameterBuffer, Sequential, prepare_qat
    from nbqat.quantization.qconfig import float8_qconfig

    rng = np.random.default_rng(3)
    xs = [(rng.standard_normal((7, 16)) * (1 + 2 * i)).astype(np.float32) for i in range(3)]
    net = Sequential(Linear(16, 8), ELU(), Linear(8, 3))
    ParameterBuffer(net, seed=0)
    qat = prepare_qat(net, float8_qconfig(), config=nbqat.QATConfig(calibration_batches=3))
    dist.calibrate(qat, xs, group)
    qat.freeze_observers()
    out = {f"scale.{k}": np.asarray(fq.scale) for k, fq in qat.fake_quants.items()}
    out["y"] = qat.predict(xs[0])
    return out


def masked_run(group, steps=3):
    """Adam steps of a tiny TFT on 7-row global batches with a target mask (a fifth batch
    item) that keeps far fewer entries in rank 0's 4 rows than in rank 1's 3. Returns the
    losses, norms and final parameters."""
    rng = np.random.default_rng(0)
    model = TemporalFusionTransformer(CFG, seed=1)
    opt = nbqat.Adam(model.params, lr=1e-2)
    losses, norms = [], []
    for _ in range(steps):
        s, h, f, y = batch(rng, 7)
        keep = np.ones(y.shape, bool)
        keep[:4, 1:] = False
        keep[5, 0] = False
        loss, total = dist.data_parallel_step(model, (s, h, f, y, keep), opt, group, max_norm=0.5)
        losses.append(loss)
        norms.append(total)
    return {"loss": np.array(losses), "norm": np.array(norms), "params": model.params.copy()}
