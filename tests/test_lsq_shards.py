"""LSQ under data parallelism with uneven shards: the allreduced scale / zero-point gradients
equal the one-process run's (LSQ's factor 1/sqrt(numel * quant_max) must use the GLOBAL
batch's element count on every rank).

In process: each "rank" runs on its slice of the global batch; the ``b_r / B``-weighted sum of
the ranks' gradients (what :func:`nbqat.distributed.allreduce_gradients` computes) is compared
with the one-process gradients of the whole batch (float32 sums: 1e-5 relative). The real
two-process runs (SGD and Adam over several steps) are in tests/test_distributed.py.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest

import nbqat
from nbqat import distributed as dist


def _lsq(per_channel):
    kw = {"observer": nbqat.MovingAverageMinMaxObserver}
    if per_channel:
        kw = {
            "observer": nbqat.MovingAveragePerChannelMinMaxObserver,
            "ch_axis": 1,
            "qscheme": "per_channel_affine",
        }
    q = nbqat.LearnableFakeQuantize(quant_min=0, quant_max=255, **kw)
    q.enable_static_estimate()
    return q


def _grads(q, x, dl, rows, global_rows):
    """One rank's (grad_x, grad_scale, grad_zero_point) of the mean loss over its ``rows``
    (``dl``: the per-row loss gradient of its slice), already weighted by rows / B."""
    q.zero_grad()
    q.shard_rows = (rows, global_rows)
    q(x)
    gy = dl / np.float32(max(rows, 1))  # the slice's mean loss
    gx = q.backward(gy)
    w = np.float32(rows / global_rows)
    return gx * w, q.grad_scale * w, q.grad_zero_point * w


@pytest.mark.parametrize("per_channel", [False, True])
@pytest.mark.parametrize("split", [(4, 3), (4, 3, 0), (1, 6), (2, 2, 3)])
def test_lsq_gradients_of_uneven_shards_equal_one_process(rng, per_channel, split):
    b = sum(split)
    x = (rng.standard_normal((b, 5)) * 2).astype(np.float32)
    x[0, 0], x[-1, -1] = 40.0, -40.0  # clipped at both ends: zero-point gradients too
    dl = rng.standard_normal((b, 5)).astype(np.float32)
    calib = _lsq(per_channel)
    calib(x)  # the qparams every rank holds (synced observers)
    calib.enable_param_learning()
    one = copy.deepcopy(calib)
    ref = _grads(one, x, dl, b, b)
    stops = np.cumsum((0, *split))
    total = [np.zeros_like(ref[1]), np.zeros_like(ref[2])]
    for r, rows in enumerate(split):
        sl = slice(stops[r], stops[r + 1])
        _, gs, gz = _grads(copy.deepcopy(calib), x[sl], dl[sl], rows, b)
        total[0] += gs
        total[1] += gz
    np.testing.assert_allclose(total[0], ref[1], rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(total[1], ref[2], rtol=1e-5, atol=1e-7)


class _Recorder(dist.ProcessGroup):
    """Rank ``rank`` of ``size``: each allreduce records this rank's buffer (no peer)."""

    def __init__(self, rank, size):
        super().__init__()
        self.rank, self.size, self.sent = rank, size, []

    def allreduce_sum(self, buf):
        self.sent.append(np.array(buf, np.float64))
        return buf


def test_data_parallel_lsq_step_gradient_equals_one_process():
    """A QAT TFT with learnable scales, a 7-row batch on 2 ranks (4 + 3 rows): the allreduced
    gradient (model and every LSQ scale / zero point) is the one-process gradient."""
    from worker_common import CFG, batch

    from nbqat.nn import TemporalFusionTransformer, train_step
    from nbqat.nn.qat import QATTemporalFusionTransformer

    rng = np.random.default_rng(0)
    cfg = nbqat.QATConfig(learnable_scales=True, calibration_batches=1)
    float_model = TemporalFusionTransformer(CFG, seed=1)
    qat = QATTemporalFusionTransformer.from_float(float_model, config=cfg)
    qat.calibrate([batch(rng, 7)[:3]])
    qat.disable_calibration()
    for fq in qat.learnable_quantizers():
        fq.enable_param_learning()
    # the observe-only output quantizer would need an observer collective, which _Recorder
    # cannot run (data_parallel_step refuses unsynced observers); it changes no gradient
    qat.fake_quants["output_fake_quant"].enable_observer(False)
    b = batch(rng, 7)
    seen = []
    one = copy.deepcopy(qat)
    hook = lambda grads: seen.append(np.concatenate([np.ravel(g) for g in grads]))  # noqa: E731
    train_step(one, b, nbqat.SGD(one.params, lr=0.0), grad_hook=hook)
    total = np.zeros_like(seen[0], np.float64)
    for rank in range(2):
        g = _Recorder(rank, 2)
        m = copy.deepcopy(qat)
        dist.data_parallel_step(m, b, nbqat.SGD(m.params, lr=0.0), g)
        total += g.sent[0]  # the weighted flat buffer, then the LSQ extras
        assert all(fq.shard_rows is None for fq in m.learnable_quantizers())
    n = qat.params.size
    np.testing.assert_allclose(total[:n], seen[0][:n], rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(total[n:], seen[0][n:], rtol=1e-4, atol=1e-6)
