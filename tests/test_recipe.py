"""The training recipe: schedule, grouped AdamW, the skip's ridge start, the fine-tune loop.

Oracles: torch's LambdaLR-free closed forms written out by hand (warm-up line, cosine), torch's
``AdamW`` with two ``param_groups`` after ``clip_grad_norm_`` (via the ``torch`` fixture), the
ridge baseline's own prediction for the ridge-started model, and a hand-written float loop for
:func:`finetune_float`.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from nbqat.nn import TemporalFusionTransformer, TFTConfig, quantile_loss_grad
from nbqat.optim import AdamW
from nbqat.train.baselines import RidgeBaseline
from nbqat.train.recipe import (
    GroupedAdamW,
    finetune_float,
    init_linear_skip_from_ridge,
    lr_at,
    skip_offset,
)

CFG = TFTConfig(2, 3, 2, 4, 5, 3, num_heads=2, linear_skip=True)


def test_lr_schedule_points():
    base, warm, total = 0.01, 4, 20
    for i in range(warm):
        assert lr_at(i, total, base, warm) == pytest.approx(base * (i + 1) / 4)
    assert lr_at(warm, total, base, warm) == pytest.approx(base)  # the peak
    mid = warm + (total - warm) // 2
    assert lr_at(mid, total, base, warm) == pytest.approx(base / 2)
    assert lr_at(total, total, base, warm) == pytest.approx(0.0, abs=1e-15)
    assert lr_at(total + 5, total, base, warm) == pytest.approx(0.0, abs=1e-15)
    vals = [lr_at(i, total, base, warm) for i in range(warm, total)]
    assert all(a >= b for a, b in zip(vals, vals[1:]))
    assert lr_at(3, 10, 1.0) == pytest.approx(0.5 * (1 + math.cos(math.pi * 0.3)))


def test_skip_offset_is_the_buffer_tail():
    m = TemporalFusionTransformer(CFG, seed=0)
    off = skip_offset(m)
    assert np.shares_memory(m.params[off:], m.linear_skip.weight)
    assert m.params.size - off == m.linear_skip.weight.size + m.linear_skip.bias.size
    plain = TemporalFusionTransformer(TFTConfig(2, 3, 2, 4, 5, 3, num_heads=2), seed=0)
    assert skip_offset(plain) == plain.params.size


def test_grouped_adamw_matches_torch_param_groups(torch, rng):
    n, off, wd, scale, max_norm = 40, 25, 0.05, 0.1, 1.0
    p0 = rng.normal(size=n).astype(np.float32)
    p = p0.copy()
    opt = GroupedAdamW(p, lr=1e-2, offset=off, weight_decay=wd, skip_lr_scale=scale)
    tp = torch.tensor(p0.copy())
    a, b = torch.nn.Parameter(tp[:off].clone()), torch.nn.Parameter(tp[off:].clone())
    topt = torch.optim.AdamW(
        [
            {"params": [a], "lr": 1e-2, "weight_decay": wd},
            {"params": [b], "lr": 1e-2 * scale, "weight_decay": 0.0},
        ],
        foreach=False,
    )
    from nbqat.clip import clip_coef, get_total_norm

    for step in range(4):
        lr = 1e-2 * (0.5 + 0.5 * step)
        opt.lr = lr
        topt.param_groups[0]["lr"], topt.param_groups[1]["lr"] = lr, lr * scale
        g = (rng.normal(size=n) * 3).astype(np.float32)
        coef = clip_coef(get_total_norm(g), max_norm)
        opt.step(g, grad_scale=coef)
        a.grad, b.grad = torch.tensor(g[:off].copy()), torch.tensor(g[off:].copy())
        torch.nn.utils.clip_grad_norm_([a, b], max_norm, foreach=False)
        topt.step()
    want = np.concatenate([a.detach().numpy(), b.detach().numpy()])
    np.testing.assert_allclose(p, want, rtol=2e-6, atol=2e-7)


def test_grouped_adamw_state_round_trip(rng):
    def run(split):
        p = np.linspace(-1, 1, 30, dtype=np.float32)
        opt = GroupedAdamW(p, lr=1e-2, offset=20, weight_decay=0.1, skip_lr_scale=0.5)
        gs = [np.sin(np.arange(30, dtype=np.float32) * (i + 1)) for i in range(5)]
        for i, g in enumerate(gs):
            if i == split:
                st = opt.state_dict()
                opt = GroupedAdamW(p, lr=1.0, offset=20, weight_decay=0.1, skip_lr_scale=0.5)
                opt.load_state_dict(st)
            opt.lr = 1e-2 / (i + 1)
            opt.step(g)
        return p

    assert np.array_equal(run(None), run(3))
    with pytest.raises(ValueError, match="offset"):
        GroupedAdamW(np.zeros(4, np.float32), lr=1e-3, offset=0)
    with pytest.raises(ValueError, match="skip_lr_scale"):
        GroupedAdamW(np.zeros(4, np.float32), lr=1e-3, offset=2, skip_lr_scale=0.0)


def test_grouped_adamw_step_is_checked_whole_before_either_group():
    # grads one too long: the body took grads[:6] and was updated, then the skip refused
    # grads[6:] ("shape (4,) ... got shape (5,)"): a half-applied step (body at step 1, skip at
    # step 0); likewise a skip rate set to inf after the body had been updated
    for grads, setup, match in (
        (np.ones(11, np.float32), None, r"parameters' shape \(10,\), got \(11,\)"),
        (np.ones(10, np.float32), ("lr", float("inf")), "learning rate"),
    ):
        p = np.ones(10, np.float32)
        opt = GroupedAdamW(p, lr=0.1, offset=6)
        if setup is not None:
            setattr(opt.skip, *setup)
        with pytest.raises(ValueError, match=match):
            opt.step(grads)
        np.testing.assert_array_equal(p, 1.0)
        assert opt.body.step_count == opt.skip.step_count == 0


def test_grouped_adamw_loads_both_groups_or_neither():
    # a state without "skip" (or with a skip of another size, or no "lr") loaded the body and
    # then failed with a bare KeyError / the skip's error: body at the saved step, skip not
    p = np.linspace(-1, 1, 10, dtype=np.float32)
    opt = GroupedAdamW(p, lr=0.1, offset=6)
    opt.step(np.ones(10, np.float32))
    saved = opt.state_dict()
    opt.step(np.ones(10, np.float32))
    now = opt.state_dict()
    small = GroupedAdamW(np.zeros(9, np.float32), lr=0.1, offset=6)
    small.step(np.ones(9, np.float32))
    for bad, match in (
        ({k: v for k, v in saved.items() if k != "skip"}, "'skip' is NoneType"),
        ({**saved, "skip": small.state_dict()["skip"]}, "exp_avg"),
        ({k: v for k, v in saved.items() if k != "lr"}, "KeyError: 'lr'"),
    ):
        with pytest.raises(ValueError, match=f"GroupedAdamW state_dict does not fit .*{match}"):
            opt.load_state_dict(bad)
        after = opt.state_dict()
        assert opt.body.step_count == opt.skip.step_count == 2 and after["lr"] == now["lr"]
        for k in ("body", "skip"):
            assert all(np.array_equal(after[k][n], now[k][n]) for n in now[k])


def test_ridge_started_model_outputs_the_ridge_forecast(rng):
    class Split:
        def __init__(self, arrays):
            self.a = arrays

        def __len__(self):
            return len(self.a[0])

        def batch(self, idx=None):
            return tuple(x if idx is None else x[idx] for x in self.a)

        def scored(self, idx=None):
            return None  # every target observed

    nb = 40
    s = rng.normal(size=(nb, 2)).astype(np.float32)
    h = rng.normal(size=(nb, 5, 2)).astype(np.float32)
    f = rng.normal(size=(nb, 3, 3)).astype(np.float32)
    y = (h[:, -1, :1] + 0.1 * rng.normal(size=(nb, 3))).astype(np.float32)
    ridge = RidgeBaseline(1.0, CFG.quantiles).fit_split(Split((s, h, f, y)))
    m = TemporalFusionTransformer(CFG, seed=1)
    init_linear_skip_from_ridge(m, ridge)
    np.testing.assert_allclose(m.forward(s, h, f), ridge.predict(s, h, f), rtol=1e-4, atol=1e-5)
    plain = TemporalFusionTransformer(TFTConfig(2, 3, 2, 4, 5, 3, num_heads=2), seed=1)
    with pytest.raises(ValueError, match="no linear skip"):
        init_linear_skip_from_ridge(plain, ridge)


def test_finetune_float_is_the_plain_training_loop(rng):
    from nbqat.clip import clip_coef, get_total_norm

    batches = [
        (
            rng.normal(size=(4, 2)).astype(np.float32),
            rng.normal(size=(4, 5, 2)).astype(np.float32),
            rng.normal(size=(4, 3, 3)).astype(np.float32),
            rng.normal(size=(4, 3)).astype(np.float32),
        )
        for _ in range(3)
    ]
    a = TemporalFusionTransformer(CFG, seed=2)
    b = TemporalFusionTransformer(CFG, seed=2)
    opt_a = AdamW(a.params, lr=1e-2)
    lrs = [1e-2, 5e-3, 1e-3]
    assert finetune_float(a, opt_a, batches, CFG.quantiles, 0.5, lambda i: lrs[i]) == 3
    opt_b = AdamW(b.params, lr=1e-2)
    for i, (s, h, f, y) in enumerate(batches):  # by hand
        opt_b.lr = lrs[i]
        b.zero_grad()
        out = b.forward(s, h, f)
        b.backward(quantile_loss_grad(out, y, CFG.quantiles))
        opt_b.step(b.grads, grad_scale=clip_coef(get_total_norm(b.grads), 0.5))
    assert np.array_equal(a.params, b.params)
    assert not np.array_equal(a.params, TemporalFusionTransformer(CFG, seed=2).params)


def test_main_job_follows_the_schedule(tmp_path, monkeypatch):
    # every optimizer step of a tiny run uses lr_at(step, planned steps, peak, warm-up)
    from nbqat.cli import main

    seen = []
    orig = GroupedAdamW.step

    def step(self, grads, grad_scale=1.0):
        seen.append((self.body.lr, None if self.skip is None else self.skip.lr))
        orig(self, grads, grad_scale)

    monkeypatch.setattr(GroupedAdamW, "step", step)
    argv = ["train", "--epochs", "2", "--qat-epochs", "1", "--batch-size", "16", "--hidden-dim",
            "4", "--heads", "1", "--history", "24", "--horizon", "6", "--windows-per-epoch", "48",
            "--calibration-batches", "2", "--eval-stride", "96", "--no-progress", "--no-plots",
            "--warmup-steps", "2", "--lr", "0.01", "--qat-lr", "0.002", "--skip-lr-scale", "0.5",
            "--qat-skip-lr-scale", "0.25", "--out", str(tmp_path)]  # fmt: skip
    assert main(argv) == 0
    float_lrs = [lr_at(i, 6, 0.01, 2) for i in range(6)]
    qat_lrs = [lr_at(i, 3, 0.002) for i in range(3)]
    want = [(x, 0.5 * x) for x in float_lrs] + [(x, 0.25 * x) for x in qat_lrs] * 2
    assert len(seen) == 6 + 3 + 3  # float, QAT, then the float_finetuned row
    np.testing.assert_allclose(np.array(seen), np.array(want), rtol=1e-12)


def test_default_history_covers_the_season(tmp_path):
    # 15-minute data: the seasonal naive reads one day (96 steps) back, so the history grows
    from nbqat.train import TrainConfig, _load_data

    t = np.datetime64("2021-01-01T00:00") + np.arange(3000) * np.timedelta64(15, "m")
    y = np.sin(np.arange(3000) * 2 * np.pi / 96) + 0.01 * np.arange(3000) % 1
    lines = ["time,load"] + [f"{a},{b:.4f}" for a, b in zip(t.astype(str), y)]
    (tmp_path / "q.csv").write_text("\n".join(lines) + "\n")
    kw = dict(out=str(tmp_path / "o"), csv=str(tmp_path / "q.csv"), time_col="time")
    cfg = TrainConfig(target_col="load", batch_size=8, **kw).resolved()
    assert cfg.history is None
    w = _load_data(cfg)
    assert w.season == 96 and w.history == cfg.history == 96
    cfg = TrainConfig(out=str(tmp_path / "o"), batch_size=8).resolved()
    assert _load_data(cfg).history == cfg.history == 24  # hourly: one day


def test_calibration_never_sees_dropout(rng):
    # observers calibrated through a dropout model (its float original left in training mode)
    # equal those of the same weights without dropout layers
    from nbqat.nn import set_dropout
    from nbqat.nn.qat import QATTemporalFusionTransformer
    from nbqat.quantization.qconfig import QATConfig

    kw = dict(num_heads=2, linear_skip=True)
    drop = TemporalFusionTransformer(TFTConfig(2, 3, 2, 4, 5, 3, dropout=0.5, **kw), seed=3)
    plain = TemporalFusionTransformer(TFTConfig(2, 3, 2, 4, 5, 3, **kw), seed=3)
    plain.params[...] = drop.params
    set_dropout(drop, True, (1, 2, 3))
    batches = [
        (
            rng.normal(size=(4, 2)).astype(np.float32),
            rng.normal(size=(4, 5, 2)).astype(np.float32),
            rng.normal(size=(4, 3, 3)).astype(np.float32),
        )
        for _ in range(2)
    ]
    quants = []
    for m in (drop, plain):
        q = QATTemporalFusionTransformer.from_float(m, config=QATConfig(calibration_batches=2))
        for s, h, f in batches:
            q.forward(s, h, f)
        quants.append({k: fq.state_dict() for k, fq in q.fake_quants.items()})
    assert quants[0].keys() == quants[1].keys()
    for k in quants[0]:
        for name, v in quants[0][k].items():
            np.testing.assert_array_equal(np.asarray(v), np.asarray(quants[1][k][name]), err_msg=k)


def _beside_torch_ema(torch, opt, p, torch_opt, decay, rng, steps):
    """``steps`` random-gradient steps of nbqat's ``opt`` over ``p`` and of ``torch_opt`` over a
    torch copy of ``p``, with torch's EMA (``AveragedModel``) updated after each; returns torch's
    weights, its average and its count."""
    from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn

    n = p.size
    lin = torch.nn.Linear(n, 1, bias=False)
    with torch.no_grad():
        lin.weight.copy_(torch.tensor(p.copy())[None])
    topt = torch_opt(lin.parameters())
    ema = AveragedModel(lin, multi_avg_fn=get_ema_multi_avg_fn(decay))
    for _ in range(steps):
        g = rng.normal(size=n).astype(np.float32)
        opt.step(g)
        lin.weight.grad = torch.tensor(g.copy())[None]
        topt.step()
        ema.update_parameters(lin)
    weights, average = (m.weight.detach().numpy()[0] for m in (lin, ema.module))
    return weights, average, int(ema.n_averaged)


def test_averaged_optimizer_is_torch_ema_averaged_model(torch, rng):
    from nbqat.train.recipe import AveragedOptimizer, swap_average

    n, decay = 30, 0.9
    p = rng.normal(size=n).astype(np.float32)
    opt = AveragedOptimizer(AdamW(p, lr=1e-2, weight_decay=0.1), decay)
    assert not swap_average(opt)  # nothing averaged yet: a no-op
    adamw = lambda ps: torch.optim.AdamW(ps, lr=1e-2, weight_decay=0.1, foreach=False)  # noqa: E731
    weights, want, count = _beside_torch_ema(torch, opt, p, adamw, decay, rng, 5)
    np.testing.assert_allclose(p, weights, rtol=2e-6, atol=2e-7)
    np.testing.assert_allclose(opt.average, want, rtol=2e-6, atol=2e-7)
    assert opt.n_averaged == count == 5
    live, avg = p.copy(), opt.average.copy()
    assert swap_average(opt)  # the model holds the average, the optimizer the live weights
    assert np.array_equal(p, avg) and np.array_equal(opt.average, live)
    swap_average(opt)
    assert np.array_equal(p, live) and np.array_equal(opt.average, avg)
    with pytest.raises(ValueError, match="decay"):
        AveragedOptimizer(AdamW(p, lr=1e-2), 1.0)


@pytest.mark.parametrize("decay", [0.995, 0.9, 0.3])
def test_averaged_optimizer_bits_are_torch_ema(torch, rng, decay):
    """The EMA is torch's ``lerp_`` bit for bit (one rounding; the ``1 - w`` form below
    weight 0.5), over an SGD whose parameters are torch's exactly; ``average += w * (p -
    average)`` (two roundings) differed in up to half the elements."""
    from nbqat.optim import SGD
    from nbqat.train.recipe import AveragedOptimizer

    p = rng.normal(size=200).astype(np.float32)
    opt = AveragedOptimizer(SGD(p, lr=0.1, momentum=0.9), decay)
    sgd = lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9, foreach=False)  # noqa: E731
    weights, want, _ = _beside_torch_ema(torch, opt, p, sgd, decay, rng, 6)
    assert np.array_equal(p, weights)
    assert np.array_equal(opt.average, want)


def test_averaged_optimizer_state_round_trip():
    from nbqat.train.recipe import AveragedOptimizer

    def run(split):
        p = np.linspace(-1, 1, 30, dtype=np.float32)
        opt = AveragedOptimizer(GroupedAdamW(p, lr=1e-2, offset=20, skip_lr_scale=0.5), 0.8)
        for i in range(5):
            if i == split:
                st = opt.state_dict()
                opt = AveragedOptimizer(GroupedAdamW(p, lr=1.0, offset=20, skip_lr_scale=0.5), 0.8)
                opt.load_state_dict(st)
            opt.lr = 1e-2 / (i + 1)
            opt.step(np.sin(np.arange(30, dtype=np.float32) * (i + 1)))
        return p.copy(), opt.average.copy()

    whole, resumed = run(None), run(3)
    assert np.array_equal(whole[0], resumed[0]) and np.array_equal(whole[1], resumed[1])
    assert not np.array_equal(whole[0], whole[1])


def test_averaged_optimizer_state_without_its_count_loads_nothing():
    # {"inner", "average"} without "n_averaged": the inner optimizer was loaded (step 1), then
    # a KeyError left the live average and count (2) beside it
    from nbqat.train.recipe import AveragedOptimizer

    p = np.ones(10, np.float32)
    opt = AveragedOptimizer(AdamW(p, lr=0.1), 0.9)
    opt.step(np.ones(10, np.float32))
    saved = opt.state_dict()
    opt.step(np.ones(10, np.float32))
    for n in ("missing", 1.5):
        bad = {k: v for k, v in saved.items() if k != "n_averaged"}
        if n != "missing":
            bad["n_averaged"] = n
        with pytest.raises(TypeError, match="n_averaged"):
            opt.load_state_dict(bad)
        assert opt.inner.step_count == opt.n_averaged == 2


_TINY = ["train", "--epochs", "2", "--qat-epochs", "1", "--batch-size", "16", "--hidden-dim",
         "4", "--heads", "1", "--history", "24", "--horizon", "6", "--windows-per-epoch", "48",
         "--calibration-batches", "2", "--eval-stride", "96", "--no-progress", "--no-plots",
         "--ema-decay", "0.5", "--warmup-steps", "1"]  # fmt: skip


def _start_never_best(monkeypatch):
    """The start's validation P50 made huge, so that a trained (averaged) epoch is kept."""
    from nbqat.train.loop import Run

    orig = Run.val_loss

    def val_loss(self, fwd):
        loss, q = orig(self, fwd)
        return (loss, 1e30) if self.best_params is None else (loss, q)

    monkeypatch.setattr(Run, "val_loss", val_loss)


def test_main_job_evaluates_and_keeps_the_weight_average(tmp_path, monkeypatch):
    # --ema-decay: each epoch's validation sees the EMA of the float weights, and the kept
    # (best) weights are that EMA, computed here by hand in float64 from every step's weights
    import json

    from nbqat.cli import main

    seen = []
    orig = GroupedAdamW.step

    def step(self, grads, grad_scale=1.0):
        orig(self, grads, grad_scale)
        seen.append(np.array(self.params, dtype=np.float64))

    monkeypatch.setattr(GroupedAdamW, "step", step)
    _start_never_best(monkeypatch)
    assert main([*_TINY, "--out", str(tmp_path)]) == 0
    state = json.loads((tmp_path / "checkpoint" / "state.json").read_text())["state"]
    n = 3 * (state["best_epoch"] + 1)  # 3 float steps an epoch
    ema = seen[0]
    for p in seen[1:n]:
        ema = 0.5 * ema + 0.5 * p
    from nbqat.train.checkpoint_schema import load_float_state

    best = load_float_state(tmp_path / "checkpoint" / "float.npz")["best_params"]
    np.testing.assert_allclose(best, ema, rtol=1e-5, atol=1e-6)
    assert np.max(np.abs(best - seen[n - 1])) > 1e-3  # not the last step's own weights


def test_main_job_weight_average_survives_resume(tmp_path):
    # the average lives in the optimizer state: an interrupted run resumes it exactly
    from nbqat.cli import main

    a, b = tmp_path / "a", tmp_path / "b"
    assert main([*_TINY, "--out", str(a)]) == 0
    assert main([*_TINY, "--out", str(b), "--stop-after-steps", "4"]) == 130
    assert main(["train", "--resume", str(b / "checkpoint")]) == 0
    assert (a / "metrics.json").read_bytes() == (b / "metrics.json").read_bytes()
