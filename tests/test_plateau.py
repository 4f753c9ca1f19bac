"""Early stopping of the main job's float phase: the start is epoch 0, and the first plateau goes
back to the best weights at ``--plateau-factor`` times the scheduled rate (torch's
``ReduceLROnPlateau(factor=...)`` with the best weights restored); the second plateau stops.

Oracle: a scripted validation P50 sequence (the real loss curve kept) and every optimizer
step's rate and weights recorded by hand, against the closed-form schedule
(:func:`nbqat.train.recipe.lr_at`) and the rule written out in each test.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from nbqat.train.checkpoint_schema import load_float_state
from nbqat.train.recipe import GroupedAdamW, lr_at

_TINY = ["train", "--epochs", "5", "--qat-epochs", "1", "--batch-size", "16", "--hidden-dim",
         "4", "--heads", "1", "--history", "24", "--horizon", "6", "--windows-per-epoch", "48",
         "--calibration-batches", "2", "--eval-stride", "96", "--no-progress", "--no-plots",
         "--warmup-steps", "1", "--lr", "0.01", "--patience", "1"]  # fmt: skip
_STEPS = 3  # 48 windows / batch 16: optimizer steps an epoch


def _script(monkeypatch, start: float, per_epoch: list[float]) -> list[tuple]:
    """Make the float phase's validation P50 ``start`` at the start and ``per_epoch[e]`` after
    epoch ``e``; return the list that records (rate, weights before, weights after) per step."""
    from nbqat.train.loop import Run

    orig_val = Run.val_loss

    def val_loss(self, fwd):
        loss, q = orig_val(self, fwd)
        if self.st.phase != "float":
            return loss, q
        return loss, start if self.best_params is None else per_epoch[self.st.epoch]

    steps: list[tuple] = []
    orig_step = GroupedAdamW.step

    def step(self, grads, grad_scale=1.0):
        before = np.array(self.params, dtype=np.float32)
        orig_step(self, grads, grad_scale)
        steps.append((self.body.lr, before, np.array(self.params, dtype=np.float32)))

    monkeypatch.setattr(Run, "val_loss", val_loss)
    monkeypatch.setattr(GroupedAdamW, "step", step)
    return steps


def _float(out) -> tuple[dict, np.ndarray]:
    m = json.loads((out / "metrics.json").read_text())
    return m["float"], load_float_state(out / "checkpoint" / "float.npz")["best_params"]


@pytest.mark.parametrize("factor", [0.25, 0.0])
def test_first_plateau_goes_back_at_a_lower_rate_and_the_second_stops(
    tmp_path, monkeypatch, factor
):
    from nbqat.cli import main

    steps = _script(monkeypatch, 1.0, [0.9, 0.95, 0.8, 0.85, 0.7])
    argv = [*_TINY, "--plateau-factor", str(factor), "--out", str(tmp_path)]
    assert main(argv) == 0
    fl, best = _float(tmp_path)
    float_steps = steps[: 3 * _STEPS if factor == 0 else 4 * _STEPS]  # then QAT's, fine-tune's
    lrs = np.array([s[0] for s in float_steps])
    sched = np.array([lr_at(i, 5 * _STEPS, 0.01, 1) for i in range(len(float_steps))])
    if factor == 0:  # the first plateau (after epoch 2) stops: the old early stopping
        assert (fl["epochs_run"], fl["best_epoch"], fl["plateau_epoch"]) == (2, 1, None)
        assert fl["early_stopped"]
        np.testing.assert_allclose(lrs[: 2 * _STEPS], sched[: 2 * _STEPS], rtol=1e-12)
        np.testing.assert_array_equal(best, steps[_STEPS - 1][2])
        return
    # epoch 1 best; epoch 2 worse: plateau -> back to epoch 1's weights, rate x 0.25;
    # epoch 3 best; epoch 4 worse: the second plateau stops (epoch 5 never runs)
    assert (fl["epochs_run"], fl["best_epoch"], fl["plateau_epoch"]) == (4, 3, 2)
    assert fl["early_stopped"] and fl["lr_factor_after_plateau"] == factor
    want = np.concatenate([sched[: 2 * _STEPS], factor * sched[2 * _STEPS : 4 * _STEPS]])
    np.testing.assert_allclose(lrs, want, rtol=1e-12)
    np.testing.assert_array_equal(steps[2 * _STEPS][1], steps[_STEPS - 1][2])  # restored
    assert not np.array_equal(steps[2 * _STEPS][1], steps[2 * _STEPS - 1][2])
    np.testing.assert_array_equal(best, steps[3 * _STEPS - 1][2])  # epoch 3's weights kept
    summary = (tmp_path / "summary.txt").read_text()
    assert "plateau after epoch 2: back to the best weights at 0.25 x the learning rate" in summary


def test_the_start_is_kept_when_no_epoch_beats_it(tmp_path, monkeypatch):
    # the ridge-started TFT outputs the ridge forecast: when no epoch beats it on validation,
    # the run keeps it (never worse on validation than the linear baseline it started from)
    from nbqat.cli import main

    steps = _script(monkeypatch, 0.5, [0.9] * 5)
    assert main([*_TINY, "--plateau-factor", "0.1", "--out", str(tmp_path)]) == 0
    fl, best = _float(tmp_path)
    assert (fl["epochs_run"], fl["best_epoch"], fl["plateau_epoch"]) == (2, 0, 1)
    assert fl["curves"]["start_val_q_risk_P50"] == [0.5]
    np.testing.assert_array_equal(best, steps[0][1])  # the weights before the first step
    np.testing.assert_array_equal(steps[_STEPS][1], steps[0][1])  # the plateau went back there
    assert "best validation P50 at the start" in (tmp_path / "summary.txt").read_text()


def test_a_run_interrupted_after_the_plateau_resumes_exactly(tmp_path, monkeypatch):
    from nbqat.cli import main

    _script(monkeypatch, 1.0, [0.9, 0.95, 0.8, 0.85, 0.7])
    a, b = tmp_path / "a", tmp_path / "b"
    argv = [*_TINY, "--plateau-factor", "0.25"]
    assert main([*argv, "--out", str(a)]) == 0
    assert main([*argv, "--out", str(b), "--stop-after-steps", str(2 * _STEPS + 1)]) == 130
    st = json.loads((b / "checkpoint" / "state.json").read_text())["state"]
    assert (st["plateau_epoch"], st["lr_factor"]) == (1, 0.25)
    assert main(["train", "--resume", str(b / "checkpoint")]) == 0
    assert (a / "metrics.json").read_bytes() == (b / "metrics.json").read_bytes()


@pytest.fixture(scope="module")
def after_plateau(tmp_path_factory):
    """A run interrupted 1 step into epoch 3, after the plateau of epoch 2 (factor 0.25)."""
    from nbqat.cli import main

    root = tmp_path_factory.mktemp("after_plateau")
    with pytest.MonkeyPatch.context() as mp:
        _script(mp, 1.0, [0.9, 0.95, 0.8, 0.85, 0.7])
        argv = [*_TINY, "--plateau-factor", "0.25", "--out", str(root / "run")]
        assert main([*argv, "--stop-after-steps", str(2 * _STEPS + 1)]) == 130
    st = json.loads((root / "run" / "checkpoint" / "state.json").read_text())["state"]
    assert (st["epoch"], st["batch_pos"], st["plateau_epoch"], st["best_epoch"]) == (2, 1, 1, 0)
    return root / "run"


def _signed(ck, fn) -> None:
    """Edit state.json and recompute its checksum (to reach the checks behind it)."""
    from nbqat.train.checkpoint_schema import digest

    meta = json.loads((ck / "state.json").read_text())
    fn(meta)
    meta["checksum"] = digest(meta)
    (ck / "state.json").write_text(json.dumps(meta))


def _set(part: str, **kv):
    return lambda m: m[part].update(kv)


@pytest.mark.parametrize(
    "edit, needle",
    [(_set("state", lr_factor=0.5), "field 'state.lr_factor': 0.5, expected 0.25"),
     (_set("state", plateau_epoch=-1), "field 'state.lr_factor': 0.25, expected 1.0"),
     (_set("state", plateau_epoch=2), "field 'state.plateau_epoch': 2, but 2 float epochs"),
     (_set("state", plateau_epoch=4), "field 'state.plateau_epoch': 4, but 2 float epochs"),
     (_set("state", best_epoch=3), "field 'state.best_epoch': 3, but 2 float epochs"),
     (lambda m: (m["config"].update(plateau_factor=0.0), m["state"].update(lr_factor=0.0)),
      "field 'state.plateau_epoch': 1, but config.plateau_factor is 0"),
     (lambda m: (m["config"].update(plateau_factor=5.0), m["state"].update(lr_factor=5.0)),
      "field 'config.plateau_factor': expected a number in [0, 1), got 5.0"),
     (_set("config", plateau_factor="abc"), "field 'config.plateau_factor': expected a number"),
     (_set("config", ema_decay="0.5"), "field 'config.ema_decay': expected a number")],
)  # fmt: skip
def test_edited_plateau_state_is_a_clear_checkpoint_error(after_plateau, tmp_path, capsys, edit,
                                                          needle):  # fmt: skip
    import shutil

    from nbqat.cli import main

    run = tmp_path / "run"
    shutil.copytree(after_plateau, run)
    ck = run / "checkpoint"
    _signed(ck, edit)
    before = {p.name: p.read_bytes() for p in ck.iterdir()}
    assert main(["train", "--resume", str(ck), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("nbqat train: error:") and "Traceback" not in err
    assert needle in err, err
    assert {p.name: p.read_bytes() for p in ck.iterdir()} == before


def test_a_diverged_epoch_is_a_clear_error_not_a_plateau(tmp_path, monkeypatch, capsys):
    # A non-finite validation P50 after epoch 1 must not count as a plateau that goes back to
    # the start and trains on: the curves can hold no NaN (strict JSON checkpoint and
    # metrics.json), so the run is refused at once with the divergence message (as before the
    # plateau existed), leaving no folder. Oracle: the exit status, the message, the disk.
    from nbqat.cli import main

    _script(monkeypatch, 1.0, [math.nan, 0.5, 0.4, 0.3, 0.2])
    out = tmp_path / "o"
    assert main([*_TINY, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "the float training diverged" in err and "epoch 1" in err and "lower --lr" in err
    assert "Traceback" not in err and "JSON" not in err
    assert not out.exists()


def test_the_plateau_restarts_the_weight_average_at_the_best_weights(torch, tmp_path, monkeypatch):
    # --ema-decay with the plateau: the best weights are the average (what was evaluated);
    # going back sets both the live weights and the average to them, so epoch 3's kept
    # average is the EMA from there (torch's lerp_, AveragedModel's update, from every step's
    # weights), with nothing of epoch 2's rejected weights in it.
    from nbqat.cli import main

    steps = _script(monkeypatch, 1.0, [0.9, 0.95, 0.8, 0.85, 0.7])
    argv = [*_TINY, "--plateau-factor", "0.25", "--ema-decay", "0.5", "--out", str(tmp_path)]
    assert main(argv) == 0
    fl, best = _float(tmp_path)
    assert (fl["best_epoch"], fl["plateau_epoch"]) == (3, 2)

    def ema(avg, step_range):
        for i in step_range:
            p = steps[i][2]
            if avg is None:
                avg = p.copy()
            else:
                avg = torch.from_numpy(avg.copy()).lerp_(torch.from_numpy(p), 0.5).numpy()
        return avg

    best1 = ema(None, range(_STEPS))  # epoch 1's average: the best until the plateau
    np.testing.assert_array_equal(steps[2 * _STEPS][1], best1)  # live weights restored to it
    np.testing.assert_array_equal(best, ema(best1, range(2 * _STEPS, 3 * _STEPS)))


def test_a_plateau_after_the_last_epoch_stops_without_a_rate_change(tmp_path, monkeypatch):
    # epochs 1-4 improve, epoch 5 (the last) does not: no epoch is left to train at the lower
    # rate, so the run stops there and reports no plateau
    from nbqat.cli import main

    _script(monkeypatch, 1.0, [0.9, 0.8, 0.7, 0.6, 0.65])
    assert main([*_TINY, "--plateau-factor", "0.25", "--out", str(tmp_path)]) == 0
    fl, _ = _float(tmp_path)
    assert (fl["epochs_run"], fl["best_epoch"], fl["plateau_epoch"]) == (5, 4, None)
    assert fl["early_stopped"] and fl["lr_factor_after_plateau"] is None
    assert "plateau" not in (tmp_path / "summary.txt").read_text()
