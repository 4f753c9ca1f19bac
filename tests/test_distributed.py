"""nbqat.distributed: the single-process group, and real 2-process runs under ``mpiexec -n 2``.

Oracles: a 1-process run of the same global batches (the data-parallel run must equal it to
reduction-order rounding, with identical qparams), one observer fed every rank's data, two
N-process runs (identical bits), and NumPy references of the step's arithmetic.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import nbqat
from nbqat import distributed as dist
from nbqat.nn import Linear, Module

HERE = Path(__file__).parent
MPIEXEC = shutil.which("mpiexec") or "mpiexec"  # missing: the tests fail, never skip


# ------------------------------------------------------------------------- single process
def test_single_process_group_is_the_identity():
    g = dist.ProcessGroup()
    a = np.arange(4.0)
    assert g.allreduce_sum(a) is a and np.array_equal(a, np.arange(4.0))
    assert g.allgather({"x": 1}) == [{"x": 1}]
    assert not g.distributed and g.rank == 0 and g.size == 1
    assert dist.init_process_group("single").backend == "single"
    with pytest.raises(ValueError, match="backend"):
        dist.init_process_group("nccl")


@pytest.mark.parametrize("rows, size", [(7, 2), (6, 3), (2, 4), (0, 2)])
def test_shard_is_numpy_array_split(rows, size):
    ref = np.array_split(np.arange(rows), size)
    for r in range(size):
        g = dist.ProcessGroup()
        g.rank, g.size = r, size
        np.testing.assert_array_equal(np.arange(rows)[dist.shard(rows, g)], ref[r])


def test_train_step_float_matches_numpy_reference():
    from worker_common import CFG, batch

    from nbqat.nn import TemporalFusionTransformer
    from nbqat.nn.loss import quantile_loss, quantile_loss_grad
    from nbqat.nn.step import train_step

    rng = np.random.default_rng(0)
    b = batch(rng)
    model = TemporalFusionTransformer(CFG, seed=1)
    ref = TemporalFusionTransformer(CFG, seed=1)
    before = model.params.copy()
    seen = []
    lr, max_norm = np.float32(0.1), 1e-3
    loss, total = train_step(
        model,
        b,
        nbqat.SGD(model.params, lr=float(lr)),
        max_norm=max_norm,
        grad_hook=lambda g: seen.append(g[0].copy()),
    )
    out = ref.forward(*b[:3])
    assert loss == pytest.approx(quantile_loss(out, b[3], CFG.quantiles), rel=1e-12)
    ref.zero_grad()
    ref.backward(quantile_loss_grad(out, b[3], CFG.quantiles))
    np.testing.assert_array_equal(seen[0], ref.grads)
    g64 = ref.grads.astype(np.float64)
    assert total == pytest.approx(np.sqrt(np.sum(g64 * g64)), rel=1e-5)
    coef = np.float32(min(max_norm / (np.float32(total) + np.float32(1e-6)), 1.0))
    expect = before - lr * (coef * ref.grads)
    np.testing.assert_allclose(model.params, expect, rtol=1e-6, atol=1e-9)


def test_data_parallel_step_single_process_equals_train_step():
    from worker_common import CFG, batch

    from nbqat.nn import TemporalFusionTransformer
    from nbqat.nn.step import train_step

    b = batch(np.random.default_rng(0))
    m1, m2 = TemporalFusionTransformer(CFG, seed=1), TemporalFusionTransformer(CFG, seed=1)
    r1 = dist.data_parallel_step(m1, b, nbqat.Adam(m1.params), dist.ProcessGroup())
    r2 = train_step(m2, b, nbqat.Adam(m2.params))
    assert r1 == r2 and np.array_equal(m1.params, m2.params)


def test_allreduce_gradients_weights_by_rows():
    class Fake(dist.ProcessGroup):  # rank 0 of 2 whose peer holds `other`
        def __init__(self, other):
            super().__init__()
            self.size, self.other = 2, other

        def allreduce_sum(self, buf):
            buf += self.other
            return buf

    g = np.array([1.0, 2.0], np.float32)
    extra = np.array([4.0], np.float32)
    peer = np.array([10.0, 20.0, 40.0], np.float32) * np.float32(4 / 6)
    dist.allreduce_gradients([g, extra], 2, 6, Fake(peer))
    np.testing.assert_allclose(g, np.array([1.0, 2.0]) * 2 / 6 + np.array([10.0, 20.0]) * 4 / 6)
    np.testing.assert_allclose(extra, [4.0 * 2 / 6 + 40.0 * 4 / 6], rtol=1e-6)


def test_sync_observers_rejects_what_cannot_merge():
    with pytest.raises(TypeError, match="mergeable observer"):
        dist.sync_observers([object()], dist.ProcessGroup())
    obs = nbqat.MinMaxObserver()
    assert dist.sync_observers([obs], dist.ProcessGroup()) == 1
    assert obs.process_group is None  # a single process needs no sync


# ----------------------------------------------------------------------------- 2 processes
def _mpirun(mode, out, n=2, timeout=600, args=()):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(HERE.parent), *sys.path]))
    env.pop("NBQAT_FORCE_SINGLE", None)
    worker = [sys.executable, str(HERE / "mpi_worker.py"), mode, str(out), *map(str, args)]
    return subprocess.run(
        [MPIEXEC, "-n", str(n), *worker],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _load(out, rank=0):
    with np.load(Path(out) / f"rank{rank}.npz") as z:
        return {k: z[k] for k in z.files}


def test_observers_in_sync_equal_one_observer_fed_everything(tmp_path):
    import mpi_worker as w

    r = _mpirun("observers", tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    r0, r1 = _load(tmp_path, 0), _load(tmp_path, 1)
    assert int(r0["size"]) == 2
    ref = w.quantizers()
    for i, b in enumerate(w.observer_batches()):
        for name, q in ref.items():
            parts = []
            for rank in range(2):
                g = dist.ProcessGroup()
                g.rank, g.size = rank, 2
                x = w.local_input(name, b, g)
                parts.append(x[:0] if (i == 2 and rank == 1) else x)
            q(np.concatenate(parts))
    for name, q in ref.items():
        for k, v in q.state_dict().items():
            key = f"{name}.{k}"
            np.testing.assert_array_equal(r0[key], np.asarray(v), err_msg=key)
            np.testing.assert_array_equal(r1[key], np.asarray(v), err_msg=key)


def test_two_process_training_equals_one_process_and_repeats_bit_for_bit(tmp_path):
    from tolerances import chain_rtol
    from worker_common import CFG, tiny_run

    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir(), b.mkdir()
    for out in (a, b):
        r = _mpirun("train", out)
        assert r.returncode == 0, r.stderr[-3000:]
    ra0, ra1, rb0 = _load(a, 0), _load(a, 1), _load(b, 0)
    for k in ra0:  # every rank holds the same model; a second run gives the same bits
        np.testing.assert_array_equal(ra0[k], ra1[k], err_msg=k)
        np.testing.assert_array_equal(ra0[k], rb0[k], err_msg=k)
    one = tiny_run(dist.ProcessGroup(), 4)
    # reduction order only: every step's loss and global gradient norm (float, then QAT)
    np.testing.assert_allclose(ra0["loss"], one["loss"], rtol=1e-5)
    np.testing.assert_allclose(ra0["norm"], one["norm"], rtol=1e-5)
    np.testing.assert_allclose(ra0["params"], one["params"], rtol=1e-4, atol=1e-7)
    # calibration of the same weights over sharded batches: the same qparams and int8 model up
    # to BLAS rounding (a shard of 3 rows and a batch of 6 take different matmul kernels, so
    # the activations differ in their last bits): each scale within the float32 rounding of a
    # chain of matmuls (fan-in 2 d = 16, a generous 12 chained layers before a quantizer:
    # tolerances.chain_rtol), a zero point within 1 (round(-min / scale) can flip), the int8
    # outputs within one output quantization step (a requantized code can flip)
    cal = [k for k in one if k.startswith("cal.")]
    assert len(cal) > 100
    rtol = chain_rtol(fan_in=2 * CFG.hidden_dim, depth=12)
    for k in cal:
        (n,) = np.shape(one[k])  # the scales, then the zero points
        np.testing.assert_allclose(ra0[k][: n // 2], one[k][: n // 2], rtol=rtol, err_msg=k)
        assert np.all(np.abs(ra0[k][n // 2 :] - one[k][n // 2 :]) <= 1), k
    np.testing.assert_allclose(ra0["int8"], one["int8"], rtol=0, atol=float(one["int8_step"]))


def test_two_process_dropout_draws_the_one_process_masks(tmp_path):
    """``dist.data_parallel_step`` with dropout active: each rank drew the mask of its own
    slice's shape from the same seed (every rank dropped the same pattern, correlated, and
    not the 1-process masks: gradient norm 3.23 against 1.46). Now the masks of the global
    batch are drawn and sliced: losses and norms equal the 1-process run's to rounding."""
    from worker_common import dropout_run

    r = _mpirun("dropout", tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    r0, r1 = _load(tmp_path, 0), _load(tmp_path, 1)
    one = dropout_run(dist.ProcessGroup())
    for k in ("loss", "norm", "params"):
        np.testing.assert_array_equal(r0[k], r1[k], err_msg=k)
    np.testing.assert_allclose(r0["loss"], one["loss"], rtol=1e-5)
    np.testing.assert_allclose(r0["norm"], one["norm"], rtol=1e-5)
    np.testing.assert_allclose(r0["params"], one["params"], rtol=1e-4, atol=1e-7)


def test_two_process_float8_activation_scales_are_the_global_batchs(tmp_path):
    """float8_qconfig()'s activation quantizers (a dynamic per-tensor scale per batch) ignored
    sync_observers: each rank kept the scale of its own slice (rank 0's 0.0107 against the
    global 0.0139), so the ranks held different models. Now every rank holds the scales of a
    1-process calibration on the whole batches, bit for bit."""
    from worker_common import float8_run

    r = _mpirun("float8", tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    one = float8_run(dist.ProcessGroup())
    for rank in (0, 1):
        got = _load(tmp_path, rank)
        for k, v in one.items():
            np.testing.assert_array_equal(got[k], v, err_msg=f"rank {rank} {k}")


def test_two_process_training_on_uneven_shards_equals_one_process(tmp_path):
    """7-row batches, 4 + 3 rows per rank, FakeQuantize and LSQ (learnable_scales, SGD and
    Adam): every step's loss and global gradient norm, and the final parameters, are the
    one-process run's (the LSQ gradient factor uses the global batch's element count)."""
    import mpi_worker as w
    from worker_common import tiny_run

    r = _mpirun("train_uneven", tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    two = _load(tmp_path, 0)
    for name, opt, lsq in w.UNEVEN_RUNS:
        one = tiny_run(dist.ProcessGroup(), 3, opt, rows=7, learnable=lsq)
        for k in ("loss", "norm"):
            np.testing.assert_allclose(two[f"{name}.{k}"], one[k], rtol=1e-5, err_msg=name)
        np.testing.assert_allclose(two[f"{name}.params"], one["params"], atol=2e-4, err_msg=name)


def test_two_process_masked_training_equals_one_process(tmp_path):
    """A target mask (--fill-gaps' invented steps) keeping 4 of 24 entries in rank 0's rows
    and 17 of 18 in rank 1's: weighting each rank by its rows gave rank 0's few entries the
    weight of 4 / 7 of the batch; each rank is now weighted by its kept entries, so the loss,
    norm and parameters are one process's mean over the kept entries."""
    from worker_common import masked_run

    r = _mpirun("masked", tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    two, one = _load(tmp_path, 0), masked_run(dist.ProcessGroup())
    for k in ("loss", "norm"):
        np.testing.assert_allclose(two[k], one[k], rtol=1e-5, err_msg=k)
    np.testing.assert_allclose(two["params"], one["params"], atol=2e-4)


def test_ranks_on_other_thread_counts_give_the_bits_of_ranks_on_one_thread(tmp_path, monkeypatch):
    # ranks started with other --threads (or NUMBA_NUM_THREADS, or Parallel.default_threads on
    # hosts with other core counts): the kernels reduce in fixed chunks and merge in order, so
    # the parallel builds on 1 and 2 threads give the same bits and the ranks stay in step
    monkeypatch.setenv("NUMBA_NUM_THREADS", "2")
    r = _mpirun("threads", tmp_path, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    for rank in range(2):
        res = _load(tmp_path, rank)
        one = [k for k in res if k.startswith("one.")]
        assert len(one) > 100
        for k in one:
            np.testing.assert_array_equal(res["mixed." + k[4:]], res[k], err_msg=f"{rank} {k}")


def test_ranks_with_other_channel_counts_raise_the_same_error_at_the_first_exchange(tmp_path):
    # a per-channel observer with 3 channels on rank 0 and 4 on rank 1: the statistics messages
    # had other lengths, and rank 0 failed in MPI ("Message from rank 1 and tag 7 truncated;
    # 136 bytes received but buffer size is 176") while rank 1 read rank 0's message as its own
    r = _mpirun("channels", tmp_path, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    errors = [str(_load(tmp_path, rank)["error"]) for rank in range(2)]
    assert errors[0] == errors[1], errors
    assert "PerChannelMinMaxObserver.forward: the ranks disagree on the channel count" in errors[0]
    assert "[3.0, 4.0]" in errors[0]


def test_a_failing_rank_stops_every_rank(tmp_path):
    t0 = time.perf_counter()
    r = _mpirun("fail", tmp_path, timeout=120)
    assert r.returncode != 0, r.stderr[-3000:]
    assert "rank 1 of 2 failed: deliberate failure" in r.stderr, r.stderr[-3000:]
    assert time.perf_counter() - t0 < 60
    assert not (tmp_path / "rank0.npz").exists()


def test_data_parallel_step_refuses_a_batch_smaller_than_the_group():
    # every rank sees the same global batch, so every rank raises before any collective
    # (before the check, the rank with the empty slice raised inside forward while the other
    # waited in an observer allgather: MPI failed with a truncated message)
    from worker_common import CFG, batch

    from nbqat.nn import TemporalFusionTransformer

    class Two(dist.ProcessGroup):
        def __init__(self, rank: int) -> None:
            super().__init__()
            self.rank, self.size = rank, 2

    b = tuple(a[:1] for a in batch(np.random.default_rng(0)))
    m = TemporalFusionTransformer(CFG, seed=1)
    p0 = m.params.copy()
    for rank in (0, 1):
        with pytest.raises(ValueError, match="fewer than the 2 processes"):
            dist.data_parallel_step(m, b, nbqat.SGD(m.params, lr=0.1), Two(rank))
    assert np.array_equal(m.params, p0)


def test_shard_refuses_negative_or_fractional_row_counts():
    # were slice(0, -3) (all but 3 rows) and a silently truncated 3.7 -> 3
    g = dist.ProcessGroup()
    with pytest.raises(ValueError, match="global_batch"):
        dist.shard(-3, g)
    with pytest.raises(TypeError, match="global_batch"):
        dist.shard(3.7, g)
    assert dist.shard(np.int64(5), g) == slice(0, 5)


def test_calibrate_single_process_equals_the_models_calibrate():
    from worker_common import CFG, batch

    from nbqat.nn import TemporalFusionTransformer
    from nbqat.nn.qat import QATTemporalFusionTransformer

    rng = np.random.default_rng(4)
    batches = [batch(rng) for _ in range(3)]
    a = QATTemporalFusionTransformer.from_float(TemporalFusionTransformer(CFG, seed=1))
    b = QATTemporalFusionTransformer.from_float(TemporalFusionTransformer(CFG, seed=1))
    assert dist.calibrate(a, batches, dist.ProcessGroup()) == 3
    assert b.calibrate(batches) == 3
    assert a.fake_quants.keys() == b.fake_quants.keys()
    for name, fq in a.fake_quants.items():
        np.testing.assert_array_equal(fq.scale, b.fake_quants[name].scale, err_msg=name)
        np.testing.assert_array_equal(fq.zero_point, b.fake_quants[name].zero_point)


class _FourInputs(Module):
    """``lin(concat(a, b, c, d))``: a model of four inputs (no forecaster)."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = Linear(8, 3)

    def forward(self, a, b, c, d):
        return self.lin(np.concatenate([a, b, c, d], axis=-1))


def test_calibrate_takes_a_generic_models_batches_as_its_calibrate_does():
    # An array batch (one input) was indexed as a tuple: its first 3 rows became 3 inputs
    # (TypeError: Sequential.forward() takes 2 positional arguments but 4 were given); a
    # model of four inputs lost the fourth (items after 3 were dropped as a forecaster's).
    from nbqat.nn import ELU, ParameterBuffer, Sequential, prepare_qat

    rng = np.random.default_rng(5)
    net = Sequential(Linear(6, 5), ELU(), Linear(5, 2))
    ParameterBuffer(net, seed=0)
    four = _FourInputs()
    ParameterBuffer(four, seed=0)
    for model, batches in (
        (net, [rng.standard_normal((8, 6)).astype(np.float32) for _ in range(3)]),
        (four, [tuple(rng.standard_normal((5, 2)).astype(np.float32) for _ in range(4))] * 2),
    ):
        a, b = prepare_qat(model), prepare_qat(model)
        assert dist.calibrate(a, batches, dist.ProcessGroup()) == b.calibrate(batches)
        for name, fq in a.fake_quants.items():
            np.testing.assert_array_equal(fq.scale, b.fake_quants[name].scale, err_msg=name)
            np.testing.assert_array_equal(fq.zero_point, b.fake_quants[name].zero_point)


class _SecondOfTwo(dist.ProcessGroup):
    """A process group that says it is rank 1 of 2 (no MPI): the checks before any exchange."""

    def __init__(self) -> None:
        super().__init__()
        self.rank, self.size = 1, 2


def test_data_parallel_step_refuses_activation_observers_not_synced_over_the_ranks():
    # Calibrated on every rank alone (qat.calibrate, not dist.calibrate), the QAT steps'
    # observers followed each rank's slice: under mpiexec -n 2 the ranks ended with different
    # scales (fc.input_fake_quant 0.018388 and 0.018413), silently. Now a clear error first.
    from nbqat.nn import LSTMForecaster, LSTMForecasterConfig, prepare_qat

    cfg = LSTMForecasterConfig(2, 3, 4, 5, 4, 3)
    rng = np.random.default_rng(0)
    b = (
        rng.standard_normal((8, 2)).astype(np.float32),
        rng.standard_normal((8, 4, 4)).astype(np.float32),
        rng.standard_normal((8, 3, 3)).astype(np.float32),
        rng.standard_normal((8, 3)).astype(np.float32),
    )
    qat = prepare_qat(LSTMForecaster(cfg, seed=0))
    qat.calibrate([b])
    opt = nbqat.SGD(qat.params, lr=1e-2)
    before = qat.params.copy()
    with pytest.raises(ValueError, match=r"not synced.*'fc.input_fake_quant'.*sync_observers"):
        dist.data_parallel_step(qat, b, opt, _SecondOfTwo(), max_norm=1.0)
    np.testing.assert_array_equal(qat.params, before)  # nothing changed
    assert qat.step == 0
    qat.freeze_observers()  # no observer runs: nothing to sync
    dist.data_parallel_step(qat, b, opt, _SecondOfTwo(), max_norm=1.0)
    assert qat.step == 1


def test_calibrate_refuses_a_batch_smaller_than_the_group():
    from worker_common import CFG, batch

    from nbqat.nn import TemporalFusionTransformer
    from nbqat.nn.qat import QATTemporalFusionTransformer

    qat = QATTemporalFusionTransformer.from_float(TemporalFusionTransformer(CFG, seed=1))
    before = {k: np.array(fq.scale) for k, fq in qat.fake_quants.items()}
    small = tuple(x[:1] for x in batch(np.random.default_rng(0)))
    with pytest.raises(ValueError, match="fewer than the 2 processes"):
        dist.calibrate(qat, [small], _SecondOfTwo())
    for k, fq in qat.fake_quants.items():  # nothing observed
        np.testing.assert_array_equal(fq.scale, before[k])


def test_calibrate_refuses_a_wrong_group_or_model_before_touching_the_observers():
    # group=None detached every observer (sync_observers(..., None)), then raised an
    # AttributeError ('NoneType' object has no attribute 'size'); a model without quantizers
    # gave AttributeError too.
    from worker_common import CFG, batch

    from nbqat.nn import TemporalFusionTransformer
    from nbqat.nn.qat import QATTemporalFusionTransformer

    qat = QATTemporalFusionTransformer.from_float(TemporalFusionTransformer(CFG, seed=1))
    two = _SecondOfTwo()
    dist.sync_observers(qat.fake_quants, two)
    batches = [batch(np.random.default_rng(0))]
    for group in (None, "world"):
        want = f"group must be a ProcessGroup.*group {type(group).__name__}"
        with pytest.raises(TypeError, match=want):
            dist.calibrate(qat, batches, group)
    with pytest.raises(TypeError, match="qat a QAT model; got group ProcessGroup, qat Temporal"):
        dist.calibrate(TemporalFusionTransformer(CFG, seed=1), batches, dist.ProcessGroup())
    for fq in qat.fake_quants.values():  # still attached to the group they had
        assert fq.activation_post_process.process_group is two
    assert qat.calibration_batches_seen == 0
