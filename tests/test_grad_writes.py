"""Backward accumulates into the gradient views in place without assigning them: ``layer.w_grad
+= g`` ran ``Module.__setattr__`` (its registry checks, a Python frame: ~1 us a write) once per
gradient, about 80 times a TFT step."""

import numpy as np

from nbqat.nn import TemporalFusionTransformer, TFTConfig, params, quantile_loss_grad


def test_tft_backward_assigns_no_gradient_attribute(rng, monkeypatch):
    cfg = TFTConfig(2, 4, 3, 8, 6, 3, num_heads=2)
    model = TemporalFusionTransformer(cfg, seed=0)
    s = rng.normal(size=(4, 2)).astype(np.float32)
    h = rng.normal(size=(4, 6, 3)).astype(np.float32)
    f = rng.normal(size=(4, 3, 4)).astype(np.float32)
    y = rng.normal(size=(4, 3)).astype(np.float32)
    out = model.forward(s, h, f)
    before = model.grads.copy()
    writes: list[str] = []
    setattr_ = params.Module.__setattr__

    def counting(self, name, value):
        writes.append(name)
        setattr_(self, name, value)

    monkeypatch.setattr(params.Module, "__setattr__", counting)
    model.backward(quantile_loss_grad(out, y, cfg.quantiles))
    assert [w for w in writes if w.endswith("_grad")] == []
    assert np.count_nonzero(model.grads != before) > 0.9 * model.grads.size  # it did accumulate
