"""An empty batch changes nothing: FakeQuantize and LearnableFakeQuantize (LSQ), per tensor and
per channel, on the CPU and on CUDA (simulator).

The reference is the same quantizer that never saw the empty batch (torch's later fix of the
report "FakeQuantize per channel fails on an empty first batch": an empty input returns an
empty result and leaves the qparams alone).
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import nbqat

# (quantizer kind, per channel, empty shape): channels on axis 1 for (0, C), axis 0 for (C, 0)
CASES = [
    (kind, per_channel, shape)
    for kind in ("fq", "lsq")
    for per_channel in (False, True)
    for shape in ((0, 8), (8, 0))
]


def _make(kind, per_channel, shape):
    obs = {"observer": nbqat.MovingAverageMinMaxObserver}
    if per_channel:
        obs = {
            "observer": nbqat.MovingAveragePerChannelMinMaxObserver,
            "ch_axis": 1 if shape[0] == 0 else 0,
            "qscheme": "per_channel_affine",
        }
    if kind == "fq":
        return nbqat.FakeQuantize(quant_min=0, quant_max=255, **obs)
    return nbqat.LearnableFakeQuantize(quant_min=0, quant_max=255, **obs)


def _state(q):
    o = q.activation_post_process
    return [np.array(a).copy() for a in (q.scale, q.zero_point, o.min_val, o.max_val)]


def _assert_same_state(a, b):
    for u, v in zip(a, b):
        np.testing.assert_array_equal(u, v)


def _data(rng, shape):
    """A non-empty batch with the empty one's channel count (8 on the same axis)."""
    full = (5, 8) if shape[0] == 0 else (8, 5)
    return (rng.standard_normal(full) * 3).astype(np.float32)


def _host(a):
    return a.copy_to_host() if hasattr(a, "copy_to_host") else np.asarray(a)


def _run(q, x, grad=True):
    """Forward (and backward with a ones gradient): output and grad_x on the host."""
    y = q(x)
    if not grad:
        return _host(y), None
    g = np.ones(_host(y).shape, np.float32)
    if hasattr(x, "copy_to_host"):
        from nbqat import _cuda

        g = _cuda.cuda.to_device(g)
    return _host(y), _host(q.backward(g))


@pytest.mark.parametrize(("kind", "per_channel", "shape"), CASES)
def test_empty_first_batch_changes_nothing(rng, kind, per_channel, shape):
    q, fresh = _make(kind, per_channel, shape), _make(kind, per_channel, shape)
    if kind == "lsq":
        for m in (q, fresh):
            m.enable_static_estimate()
    before = _state(q)
    empty = np.zeros(shape, np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "must run observer" warning either
        y, gx = _run(q, empty)
    assert y.shape == shape and y.dtype == np.float32 and gx.shape == shape
    _assert_same_state(_state(q), before)
    if kind == "lsq":
        assert not q.grad_scale.any() and not q.grad_zero_point.any()
    x = _data(rng, shape)  # then a real batch: as if the empty one had never come
    np.testing.assert_array_equal(_run(q, x)[0], _run(fresh, x)[0])
    _assert_same_state(_state(q), _state(fresh))
    after = _state(q)
    y2, gx2 = _run(q, empty)  # and an empty batch later: nothing changes either
    assert y2.shape == shape and gx2.shape == shape
    _assert_same_state(_state(q), after)
    if kind == "lsq":
        np.testing.assert_array_equal(q.grad_scale, fresh.grad_scale)


@pytest.mark.parametrize(("kind", "per_channel", "shape"), CASES)
def test_empty_batch_with_fake_quant_off_returns_it(kind, per_channel, shape):
    q = _make(kind, per_channel, shape)
    q.disable_fake_quant()
    empty = np.zeros(shape, np.float32)
    before = _state(q)
    assert q(empty) is empty and q.ctx is None
    _assert_same_state(_state(q), before)


@pytest.mark.parametrize(("kind", "per_channel", "shape"), CASES[::2] + CASES[1::4])
def test_empty_batch_on_cuda(cuda_sim, small_cuda_blocks, rng, kind, per_channel, shape):
    q, host = _make(kind, per_channel, shape), _make(kind, per_channel, shape)
    if kind == "lsq":
        for m in (q, host):
            m.enable_static_estimate()
    before = _state(q)
    y, gx = _run(q, cuda_sim.to_device(np.zeros(shape, np.float32)))
    assert y.shape == shape and gx.shape == shape
    _assert_same_state(_state(q), before)
    x = _data(rng, shape)
    np.testing.assert_array_equal(_run(q, cuda_sim.to_device(x), grad=False)[0], host(x))
    _assert_same_state(_state(q), _state(host))
