"""Ranks that would run different data-parallel steps are refused, on every rank, first.

Under ``mpiexec -n 2``, before the check: a model whose parameter count differed between the
ranks (another hidden size) ended the job in MPI ("Message from rank 1 ... truncated"), and a
model built with another seed on one rank, or another global batch (another data file, another
batch size: rows 8 and 9), trained silently (the ranks' parameters diverged, or each rank's
slice was weighted by its own row count). ``calibrate`` merged the observers of ranks fed other
data silently, and a rank with fewer batches left calibration while the other waited in an
observer allgather (the next collectives read each other's messages: a misleading "different
channel counts" error). The ranks' fingerprints are compared here through a
process group that stands for rank 0 of 2 whose peer holds another model or batch.
"""

from __future__ import annotations

import numpy as np
import pytest
from worker_common import CFG, batch

import nbqat
from nbqat import distributed as dist
from nbqat._dist_agree import fingerprint
from nbqat.nn import TemporalFusionTransformer, prepare_qat


class _FirstOfTwo(dist.ProcessGroup):
    """Rank 0 of 2 (no MPI); rank 1 holds ``peer`` = (model, batch)."""

    def __init__(self, peer) -> None:
        super().__init__()
        self.size, self.peer = 2, peer

    def allgather_array(self, a):
        return np.stack([a, fingerprint(*self.peer)])

    def allreduce_sum(self, buf):
        buf *= 2  # the peer holds the same values: the sum of both ranks
        return buf


@pytest.mark.parametrize(
    "peer_seed, peer_rows, match",
    [
        (2, 6, "parameter values"),
        (1, 5, r"global batch rows.*\[6\.0, 5\.0\]"),
        (1, "noise", "global batch values"),
    ],
)
def test_ranks_with_other_parameters_or_batches_are_refused(peer_seed, peer_rows, match):
    b = tuple(a[:6] for a in batch(np.random.default_rng(0)))
    if peer_rows == "noise":
        pb = tuple(a.copy() for a in b)
        pb[1][0, 0, 0] += 1.0  # one value of another data file
    else:
        pb = tuple(a[:peer_rows] for a in b)
    m = TemporalFusionTransformer(CFG, seed=1)
    p0 = m.params.copy()
    group = _FirstOfTwo((TemporalFusionTransformer(CFG, seed=peer_seed), pb))
    with pytest.raises(ValueError, match=match):
        dist.data_parallel_step(m, b, nbqat.SGD(m.params, lr=0.1), group)
    assert np.array_equal(m.params, p0)  # nothing ran


def test_ranks_that_agree_run_the_step():
    b = tuple(a[:6] for a in batch(np.random.default_rng(0)))
    m = TemporalFusionTransformer(CFG, seed=1)
    group = _FirstOfTwo((TemporalFusionTransformer(CFG, seed=1), b))
    loss, norm = dist.data_parallel_step(m, b, nbqat.SGD(m.params, lr=0.1), group)
    assert np.isfinite(loss) and np.isfinite(norm)


@pytest.mark.parametrize("peer_has", ["nothing", "other"])
def test_calibrate_refuses_ranks_with_other_or_fewer_batches(peer_has):
    b = tuple(a[:6] for a in batch(np.random.default_rng(0)))
    qat = prepare_qat(TemporalFusionTransformer(CFG, seed=1))
    other = tuple(a + 1 for a in b[:3])
    peer = (qat, () if peer_has == "nothing" else other)
    match = "batch items .0: no batch left" if peer_has == "nothing" else "global batch values"
    with pytest.raises(ValueError, match=f"calibrate: the ranks disagree on the {match}"):
        dist.calibrate(qat, [b], _FirstOfTwo(peer))


class _Recorder(dist.ProcessGroup):
    """Rank 0 of 2 whose peer sends the messages ``peer`` in turn (default: this rank's own
    messages); records the messages sent."""

    def __init__(self, peer=None) -> None:
        super().__init__()
        self.size, self.peer, self.sent = 2, peer, []

    def allgather_array(self, a):
        self.sent.append(np.asarray(a, np.float64))
        peer = self.sent[-1] if self.peer is None else self.peer[len(self.sent) - 1]
        return np.stack([self.sent[-1], peer])

    def allreduce_sum(self, buf):
        buf *= 2
        return buf


def test_ranks_running_other_observer_types_are_refused_at_the_first_exchange():
    # under mpiexec -n 2, a HistogramObserver on rank 0 and a MinMaxObserver on rank 1 (the
    # same statistics message) hung: rank 1 was done, rank 0 waited in the histogram's sum
    x = np.random.default_rng(0).standard_normal((4, 4)).astype(np.float32)
    rec = _Recorder()
    minmax = nbqat.MinMaxObserver()
    dist.sync_observers([minmax], rec)
    minmax(x)
    hist = nbqat.HistogramObserver(bins=64)
    dist.sync_observers([hist], _Recorder(peer=rec.sent))
    with pytest.raises(
        ValueError, match="HistogramObserver.forward: the ranks disagree on the observer type"
    ):
        hist(x)
    same = nbqat.HistogramObserver(bins=64)
    dist.sync_observers([same], _Recorder())
    same(x)  # ranks that agree observe
    assert np.isfinite(same.calculate_qparams()[0]).all()


@pytest.mark.parametrize(
    "make",
    [
        lambda k: nbqat.HistogramObserver(bins=64 * k),
        lambda k: nbqat.PercentileObserver(mantissa_bits=2 + k),
    ],
)
def test_ranks_running_observers_of_other_settings_are_refused_at_the_first_exchange(make):
    # under mpiexec -n 2, HistogramObserver(bins=64) on rank 0 and bins=128 on rank 1 passed the
    # statistics exchange (same type) and ended in the counts' allreduce ("Message from rank 1
    # and tag 14 truncated; 256 bytes received but buffer size is 512"); a key grid's mantissa
    # bits size its counts alike
    x = np.random.default_rng(0).standard_normal((4, 4)).astype(np.float32)
    rec = _Recorder()
    other = make(2)
    dist.sync_observers([other], rec)
    other(x)
    obs = make(1)
    dist.sync_observers([obs], _Recorder(peer=rec.sent))
    with pytest.raises(
        ValueError, match="the ranks disagree on the observer type or configuration:"
    ):
        obs(x)
    assert obs.state_dict()["min_val"] == np.inf  # nothing observed
