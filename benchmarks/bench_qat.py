"""QAT training step of the TFT-like forecaster, measured in the same run against

* nbqat's float training step at the same config (target: QAT <= 1.3x the float step), twice:
  as a float model runs by default (``qat_over_float``, with the algebraic folds of
  ``Module.set_folding``, which the QAT step cannot use: a fake-quantized activation sits
  between the folded maps) and with folding off (``qat_over_unfolded_float``: the same graph
  the QAT step runs, so the ratio is the cost of fake quantization itself), and
* the same network in torch eager mode with ``torch.ao.quantization.FakeQuantize`` modules at
  the same places (tests/ref_qat_torch.py; target: nbqat >= 2x faster).

Every step is forward -> pinball loss -> backward -> total gradient norm -> Adam with clipping
(max_norm 1.0). Config: the float benchmark's (B=64, k=48, tau=12, hidden 32, 4 heads, 2 static,
4 known, 3 observed inputs, float32); ``NBQAT_BENCH_SMALL=1`` shrinks it for a smoke run.
The QAT and float steps alternate (``_roof.paired_ratio``): the QAT/float figure is the median
of the per-pair ratios, with its quartiles. Ratios are reported, not asserted.
"""

from __future__ import annotations

import os
import sys

import numba
import numpy as np
import pytest
from _roof import median_time, paired_ratio, report
from conftest import SMALL
from threadpoolctl import threadpool_limits

sys.path.insert(0, os.path.join(os.path.dirname(__file__), os.pardir, "tests"))

from nbqat import Adam, QATConfig  # noqa: E402
from nbqat.clip import clip_coef, get_total_norm  # noqa: E402
from nbqat.nn import (  # noqa: E402
    TemporalFusionTransformer,
    TFTConfig,
    quantile_loss,
    quantile_loss_grad,
)
from nbqat.nn.qat import QATTemporalFusionTransformer  # noqa: E402

B, K, TAU, D = (8, 12, 4, 16) if SMALL else (64, 48, 12, 32)
CFG = TFTConfig(2, 4, 3, D, K, TAU, num_heads=4)
REPEAT = 3 if SMALL else 7
ROUNDS = 3 if SMALL else 21


def _batch(rng):
    return (
        rng.standard_normal((B, 2)).astype(np.float32),
        rng.standard_normal((B, K, 3)).astype(np.float32),
        rng.standard_normal((B, TAU, 4)).astype(np.float32),
        rng.standard_normal((B, TAU)).astype(np.float32),
    )


def _float_step(model, opt, batch):
    def step():
        model.zero_grad()
        out = model.forward(*batch[:3])
        quantile_loss(out, batch[3], CFG.quantiles)
        model.backward(quantile_loss_grad(out, batch[3], CFG.quantiles))
        total = get_total_norm(model.grads)
        opt.step(model.grads, grad_scale=clip_coef(total, 1.0))

    return step


def _torch_step(torch, qat, batch):
    from ref_qat_torch import instrument
    from ref_tft_torch import make_torch_tft

    tm = make_torch_tft(torch, CFG, qat.model.state_dict(), torch.float32)
    fqs = instrument(torch, tm, qat)
    s, h, f, y = (torch.from_numpy(a) for a in batch)
    tm(s, h, f)  # calibration forward (observers only), then QAT
    for m in fqs.values():
        m.disable_fake_quant()
    tm(s, h, f)
    for m in fqs.values():
        m.enable_fake_quant()
    opt = torch.optim.Adam(tm.parameters(), lr=1e-3)
    q = torch.tensor(CFG.quantiles)

    def step():
        opt.zero_grad()
        e = y.unsqueeze(-1) - tm(s, h, f)
        loss = torch.maximum(q * e, (q - 1) * e).mean()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(tm.parameters(), 1.0)
        opt.step()

    return step


def test_qat_train_step(benchmark):
    torch = pytest.importorskip("torch")
    torch.set_num_threads(numba.get_num_threads())
    rng = np.random.default_rng(0)
    batch = _batch(rng)
    model = TemporalFusionTransformer(CFG, seed=0)
    qat = QATTemporalFusionTransformer.from_float(model, config=QATConfig(calibration_batches=1))
    qat.forward(*batch[:3])  # calibration
    qat.disable_calibration()
    opt = Adam(qat.params, lr=1e-3)
    float_step = _float_step(model, Adam(model.params, lr=1e-3), batch)
    unfolded = TemporalFusionTransformer(CFG, seed=0)
    unfolded.set_folding(False)
    unfolded_step = _float_step(unfolded, Adam(unfolded.params, lr=1e-3), batch)
    torch_step = _torch_step(torch, qat, batch)

    def qat_step():
        qat.train_step(batch, opt, max_norm=1.0)

    # nbqat's steps run with NumPy's BLAS on one thread, as `nbqat train` does (threadpoolctl):
    # its small matmuls gain nothing from a second BLAS thread, whose spinning starves Numba's
    # worker. torch keeps its own thread pools (intra-op threads = Numba's thread count).
    # QAT and float steps alternate (paired_ratio): the ratio is the median over the pairs.
    with threadpool_limits(limits=1, user_api="blas"):
        qat_step()  # compile / warm up
        float_step()
        unfolded_step()
        benchmark.pedantic(qat_step, rounds=REPEAT, iterations=1, warmup_rounds=1)
        ratio, q1, q3, t_qat, t_float = paired_ratio(qat_step, float_step, rounds=ROUNDS)
        ratio_u, q1_u, q3_u, _, t_unfolded = paired_ratio(qat_step, unfolded_step, rounds=ROUNDS)
    t_torch = median_time(torch_step, repeat=REPEAT)
    report(
        benchmark,
        qat_ms=t_qat * 1e3,
        float_ms=t_float * 1e3,
        torch_qat_ms=t_torch * 1e3,
        qat_over_float=ratio,
        qat_over_float_q1=q1,
        qat_over_float_q3=q3,
        unfolded_float_ms=t_unfolded * 1e3,
        qat_over_unfolded_float=ratio_u,
        qat_over_unfolded_float_q1=q1_u,
        qat_over_unfolded_float_q3=q3_u,
        torch_over_nbqat_qat=t_torch / t_qat,
        quantizers=float(len(qat.fake_quants)),
    )
