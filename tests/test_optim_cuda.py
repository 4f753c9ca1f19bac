"""CUDA twins of the optimizer kernels under the simulator (tiny buffers, tiny blocks) against
the CPU kernels. The simulator evaluates cuda.fma with two roundings and sqrt in float64, so
results agree to a few float32 ulps (a real GPU gives the CPU bits)."""

from __future__ import annotations

import numpy as np
import pytest

import nbqat


@pytest.fixture
def dev(cuda_sim, small_cuda_blocks):
    return cuda_sim


CASES = [
    ("SGD", dict(lr=0.1, momentum=0.9, weight_decay=0.01)),
    ("SGD", dict(lr=0.1, momentum=0.8, nesterov=True)),
    ("SGD", dict(lr=0.1)),
    ("Adam", dict(lr=1e-2, weight_decay=0.1)),
    ("AdamW", dict(lr=1e-2)),
    ("AdamW", dict(lr=1e-2, betas=(0.3, 0.9))),
]


@pytest.mark.parametrize("name,kw", CASES)
def test_step_matches_cpu(dev, rng, name, kw):
    n = 29
    p0 = rng.standard_normal(n).astype(np.float32)
    grads = [rng.standard_normal(n).astype(np.float32) for _ in range(3)]
    hp = p0.copy()
    dp = dev.to_device(p0)
    ho = getattr(nbqat, name)(hp, **kw)
    do = getattr(nbqat, name)(dp, **kw)
    for g in grads:
        ho.step(g, grad_scale=0.5)
        do.step(dev.to_device(g), grad_scale=0.5)
    got = dp.copy_to_host()
    np.testing.assert_allclose(got, hp, rtol=0, atol=4 * np.spacing(np.abs(hp).max()))
    sd_h, sd_d = ho.state_dict(), do.state_dict()
    assert sd_d["step"] == 3
    for k in set(sd_h) - {"type", "step", "lr", "momentum", "dampening", "weight_decay",
                          "nesterov", "betas", "eps"}:  # fmt: skip
        assert isinstance(sd_d[k], np.ndarray)
        np.testing.assert_allclose(sd_d[k], sd_h[k], rtol=1e-6, atol=1e-7)


def test_float64_and_state_round_trip(dev, rng):
    p0 = rng.standard_normal(17)
    g = rng.standard_normal(17)
    dp = dev.to_device(p0)
    o = nbqat.AdamW(dp)
    o.step(dev.to_device(g))
    dq = dev.to_device(dp.copy_to_host())
    o2 = nbqat.AdamW(dq)
    o2.load_state_dict(o.state_dict())
    o.step(dev.to_device(g))
    o2.step(dev.to_device(g))
    assert np.array_equal(dp.copy_to_host(), dq.copy_to_host())


def test_device_mismatch_raises(dev, rng):
    dp = dev.to_device(np.zeros(8, np.float32))
    o = nbqat.SGD(dp, lr=0.1)
    with pytest.raises(TypeError, match="same device"):
        o.step(np.zeros(8, np.float32))
