"""``mpiexec -n 2 nbqat train``: the main job data-parallel over two processes.

Oracles: the 1-process run of the same configuration (``nbqat train`` in this process): every
step's loss and gradient norm within 1e-5 relative (reduction order only), q-risk within 1e-5;
qparams within a few ulps (most identical) where both runs calibrate the same weights (a
1-process checkpoint continued by 2 processes); an audit hook that records every write below
``--out`` (only rank 0 writes); and a checkpoint's bytes before and after a failed run.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import numpy as np
import pytest
from test_cli import TINY
from test_distributed import _mpirun

from nbqat import distributed as dist
from nbqat.cli import main

#: TINY without the TFT's --heads (an error with --model lstm)
TINY_LSTM = TINY[: TINY.index("--heads")] + TINY[TINY.index("--heads") + 2 :]


def _ref(out: Path, *extra: str, base: list[str] = TINY) -> Path:
    assert main(["train", *base, "--out", str(out), *extra]) == 0
    return out


def _mpi_train(rec: Path, *argv: str, mode: str = "main", timeout: int = 300):
    rec.mkdir(parents=True, exist_ok=True)
    return _mpirun(mode, rec, args=("train", *argv), timeout=timeout)


def _metrics(out: Path) -> dict:
    return json.loads((out / "metrics.json").read_text())


def _state(out: Path) -> dict:
    return json.loads((out / "checkpoint" / "state.json").read_text())["state"]


def _close_q_risk(a: dict, b: dict, rtol: float = 1e-5) -> None:
    qa, qb = a["q_risk_test"], b["q_risk_test"]
    assert qa.keys() == qb.keys()
    for model in qa:
        for k in qa[model]:
            assert qb[model][k] == pytest.approx(qa[model][k], rel=rtol), (model, k)


def _qat_arrays(out: Path) -> dict:
    """The arrays of a run's ``qat.npz``, keyed by their path in its manifest."""
    found: dict = {}

    def walk(node, path):
        if isinstance(node, dict):
            if "__array__" in node:
                found[path] = z[node["__array__"]]
            for k, v in node.items():
                walk(v, f"{path}/{k}")
        elif isinstance(node, list):
            for i, v in enumerate(node):
                walk(v, f"{path}/{i}")

    with np.load(out / "checkpoint" / "qat.npz") as z:
        walk(json.loads(bytes(z["__nbqat_manifest__"]).decode()), "")
    return found


def _close_steps(a: dict, b: dict, rtol: float = 1e-5) -> None:
    assert a["step_losses"].keys() == b["step_losses"].keys() == {"float", "qat"}
    for ph in a["step_losses"]:
        np.testing.assert_allclose(b["step_losses"][ph], a["step_losses"][ph], rtol=rtol)
        np.testing.assert_allclose(b["grad_norms"][ph], a["grad_norms"][ph], rtol=rtol)


@pytest.fixture(scope="module")
def one(tmp_path_factory) -> Path:
    """The 1-process reference run."""
    return _ref(tmp_path_factory.mktemp("one") / "run")


@pytest.fixture(scope="module")
def two(tmp_path_factory) -> tuple[Path, Path]:
    """The same run on 2 processes: (run folder, folder of the ranks' write records)."""
    base = tmp_path_factory.mktemp("two")
    r = _mpi_train(base / "rec", *TINY, "--out", str(base / "run"))
    assert r.returncode == 0, r.stderr[-3000:]
    return base / "run", base / "rec"


def test_two_processes_equal_one_process(one, two):
    m1, m2 = _metrics(one), _metrics(two[0])
    assert m2["world_size"] == 2 and "world_size" not in m1
    assert {k: v for k, v in m2.items() if k != "world_size"}.keys() == m1.keys()
    assert m2["config"] == m1["config"] and m2["data"] == m1["data"]
    _close_steps(_state(one), _state(two[0]))  # every step's loss and global gradient norm
    _close_q_risk(m1, m2)
    # qparams after the QAT steps: the weights differ by rounding only (reduction order, and
    # BLAS kernels that depend on the shard's shape), so do the ranges. The parameters are
    # allowed 1e-4 relative below (Adam magnifies a rounding difference in a near-zero
    # gradient); a range is a 1-Lipschitz function (max, min) of activations that move with the
    # weights, so the scales are allowed the same 1e-4 (measured: 1.8e-5 with Haswell's
    # kernels), a zero point 1 (round(-min / scale) can flip)
    a, b = _qat_arrays(one), _qat_arrays(two[0])
    assert a.keys() == b.keys()
    qparams = [k for k in a if "/quantizers/" in k and k.endswith(("/scale", "/zero_point"))]
    assert len(qparams) > 100
    for k in qparams:
        if k.endswith("/scale"):
            np.testing.assert_allclose(b[k], a[k], rtol=1e-4, err_msg=k)
        else:
            assert np.all(np.abs(b[k].astype(np.int64) - a[k].astype(np.int64)) <= 1), k
    _close_adam_params(m1, _state(one), a, b)


def _close_adam_params(metrics: dict, state: dict, a: dict, b: dict) -> None:
    """Parameters after the Adam steps of a 1-process (``a``) and a 2-process (``b``) run.

    Adam magnifies a rounding difference in a near-zero gradient (docs/distributed.md): such a
    component can move by up to one step size (the learning rate) per step in one run and not in
    the other. So nearly all parameters agree to 1e-4 relative, and every one within the sum of
    the step sizes; a gradient-sync bug moves most of them (measured: 0 to 3 of 9834 outside
    1e-4, at most 5.3e-5 apart, on different machines and BLAS builds).
    """
    k = "/state/__dict__/model/__dict__/params"
    close = np.isclose(b[k], a[k], rtol=1e-4, atol=1e-5)
    assert close.mean() >= 0.99, f"{np.count_nonzero(~close)} of {close.size} parameters differ"
    cfg, steps = metrics["config"], {ph: len(v) for ph, v in state["step_losses"].items()}
    assert steps["float"] > 0 and steps["qat"] > 0, steps
    bound = cfg["lr"] * steps["float"] + cfg["qat_lr"] * steps["qat"]
    np.testing.assert_array_less(np.abs(b[k] - a[k]), bound)


def test_two_process_runs_repeat_bit_for_bit(two, tmp_path):
    run = tmp_path / "run"
    r = _mpi_train(tmp_path / "rec", *TINY, "--out", str(run))
    assert r.returncode == 0, r.stderr[-3000:]
    assert (run / "metrics.json").read_bytes() == (two[0] / "metrics.json").read_bytes()
    a, b = _qat_arrays(two[0]), _qat_arrays(run)
    assert a.keys() == b.keys()
    for k in a:
        np.testing.assert_array_equal(b[k], a[k], err_msg=k)


def test_lstm_with_histogram_observers_on_two_processes_equals_one(tmp_path):
    # the other forecaster and the observers frozen after calibration (no QAT-phase sync)
    extra = ("--model", "lstm", "--observer", "histogram")
    ref = _ref(tmp_path / "one", *extra, base=TINY_LSTM)
    run = tmp_path / "two"
    r = _mpi_train(tmp_path / "rec", *TINY_LSTM, *extra, "--out", str(run))
    assert r.returncode == 0, r.stderr[-3000:]
    m1, m2 = _metrics(ref), _metrics(run)
    assert m2["world_size"] == 2 and m2["config"] == m1["config"]
    assert m2["model"] == m1["model"] and m1["model"]["name"] == "lstm"
    _close_steps(_state(ref), _state(run))
    _close_q_risk(m1, m2)


def test_only_rank_0_writes(two):
    out, rec = two
    w0 = json.loads((rec / "writes0.json").read_text())
    w1 = json.loads((rec / "writes1.json").read_text())
    assert w1 == []  # rank 1 created, changed or removed nothing below --out
    written = {Path(p).name for _, p in w0}
    for name in ("metrics.json", "timings.json", "summary.txt", "model.onnx", "checkpoint"):
        assert name in written, sorted(written)  # the recorder sees rank 0's writes
    assert (out / "loss_curves.png").exists() and (out / "quant_report.json").exists()
    assert "data-parallel over 2 processes (MPI)" in (out / "summary.txt").read_text()


def test_a_one_process_checkpoint_continued_by_two_calibrates_the_same(tmp_path):
    # stopped after the last float step: both continuations calibrate the same weights over
    # the same batches (sharded and synced over 2 processes), and with no QAT step the QAT
    # and int8 models hold the calibration's qparams. The observers merge exactly, but not
    # every activation is the same bits on half the rows: OpenBLAS's small-matrix sgemm gives
    # row results that depend on the row count for some shapes (e.g. (48, 37) @ (37, 32)), so
    # a range may move by an ulp
    extra = ("--qat-epochs", "0")
    ref = _ref(tmp_path / "ref", *extra)
    run = tmp_path / "run"
    assert main(["train", *TINY, *extra, "--out", str(run), "--stop-after-steps", "6"]) == 130
    assert _state(run)["phase"] == "float"
    r = _mpi_train(tmp_path / "rec", "--resume", str(run / "checkpoint"))
    assert r.returncode == 0, r.stderr[-3000:]
    a, b = _qat_arrays(ref), _qat_arrays(run)
    assert a.keys() == b.keys()
    k = "/state/__dict__/model/__dict__/params"
    np.testing.assert_array_equal(b[k], a[k])  # the float phase ran on one process
    scales = [k for k in a if "/quantizers/" in k and k.endswith("/scale")]
    assert len(scales) > 100
    same = 0
    for k in scales:
        np.testing.assert_allclose(b[k], a[k], rtol=1e-6, err_msg=k)  # a few ulps at most
        zp = k[: -len("scale")] + "zero_point"
        assert np.max(np.abs(b[zp].astype(np.int64) - a[zp]), initial=0) <= 1, zp
        same += np.array_equal(b[k], a[k]) and np.array_equal(b[zp], a[zp])
    assert same >= 0.9 * len(scales)
    m1, m2 = _metrics(ref), _metrics(run)
    _close_q_risk(m1, m2, rtol=1e-6)
    assert m2["q_risk_test"]["float"] == m1["q_risk_test"]["float"]  # the same weights
    assert m2["world_size"] == 2


def test_a_two_process_checkpoint_in_qat_continued_by_one_and_by_two(one, two, tmp_path):
    run = tmp_path / "run"
    # 6 float steps, then 1 of the 3 QAT steps: the checkpoint holds the synced QAT state
    r = _mpi_train(tmp_path / "rec", *TINY, "--out", str(run), "--stop-after-steps", "7")
    assert r.returncode == 130, r.stderr[-3000:]
    assert r.stderr.count("continue with `nbqat train --resume") == 1  # rank 0 says it
    st = _state(run)
    assert (st["phase"], st["batch_pos"]) == ("qat", 1)
    again = tmp_path / "again"
    shutil.copytree(run, again)
    assert main(["train", "--resume", str(run / "checkpoint")]) == 0  # on one process
    m = _metrics(run)
    assert "world_size" not in m  # the last session ran on one process
    _close_steps(_state(one), _state(run))
    _close_q_risk(_metrics(one), m)
    # on two processes again: the uninterrupted 2-process run's bytes
    r = _mpi_train(tmp_path / "rec2", "--resume", str(again / "checkpoint"))
    assert r.returncode == 0, r.stderr[-3000:]
    assert (again / "metrics.json").read_bytes() == (two[0] / "metrics.json").read_bytes()


def test_a_batch_smaller_than_the_process_count_is_refused(tmp_path, capsys):
    from nbqat.train import TrainConfig, run

    cfg = TrainConfig(quick=True, batch_size=1, out=str(tmp_path / "o"))
    with pytest.raises(SystemExit):
        run(cfg, group=_Rank(0))
    assert "--batch-size 1 is smaller than the 2 processes" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_a_failing_rank_ends_every_rank_and_keeps_the_checkpoint(tmp_path):
    run = tmp_path / "run"
    assert main(["train", *TINY, "--out", str(run), "--stop-after-steps", "2"]) == 130
    ck = run / "checkpoint"
    before = {p.name: p.read_bytes() for p in ck.iterdir()}
    t0 = time.perf_counter()
    r = _mpi_train(tmp_path / "rec", "--resume", str(ck), mode="main_fail", timeout=120)
    assert r.returncode != 0
    assert "nbqat: rank 1 of 2 failed: RuntimeError: deliberate failure" in r.stderr, r.stderr
    assert time.perf_counter() - t0 < 60
    assert {p.name: p.read_bytes() for p in ck.iterdir()} == before
    assert not (run / "metrics.json").exists()
    shutil.rmtree(tmp_path / "rec")
    assert main(["train", "--resume", str(ck), "--check"]) == 0  # still loadable


# ------------------------------------------------------------------- in-process, no mpiexec
class _Rank(dist.ProcessGroup):
    """Rank ``rank`` of a pretend 2-process group (collectives never reached here)."""

    def __init__(self, rank: int) -> None:
        super().__init__()
        self.rank, self.size = rank, 2

    def abort(self, code: int = 1) -> None:
        raise SystemExit(code)


@pytest.mark.parametrize("m", [1, 3])  # rows per batch row in the layer's leading axis
def test_dropout_rows_take_the_global_batch_mask(m):
    from nbqat.nn import Dropout

    g, d = 7, 5
    x = np.random.default_rng(0).standard_normal((g * m, d)).astype(np.float32)
    full = Dropout(0.4)
    full.training, full.seed = True, (3, 1, 2)
    y = full.forward(x)
    for rank in range(2):
        sl = dist.shard(g, _Rank(rank))
        part = Dropout(0.4)
        part.training, part.seed, part.rows = True, (3, 1, 2), (g, sl.start, sl.stop)
        rows = slice(sl.start * m, sl.stop * m)
        np.testing.assert_array_equal(part.forward(x[rows]), y[rows])
        np.testing.assert_array_equal(part.backward(np.ones_like(x[rows])), full.mask[rows])


def test_compare_clipping_is_refused_on_several_processes(tmp_path, capsys):
    from nbqat.train import TrainConfig, run

    cfg = TrainConfig(quick=True, compare_clipping=True, out=str(tmp_path / "o"))
    with pytest.raises(SystemExit) as e:
        run(cfg, group=_Rank(1))
    assert e.value.code == 1
    err = capsys.readouterr().err
    assert "nbqat: rank 1 of 2 failed: ValueError: --compare-clipping runs on one process" in err
    assert not (tmp_path / "o").exists()


def test_a_stop_on_one_rank_is_a_stop_on_every_rank():
    from nbqat.train.loop import Interrupt

    class Sum(_Rank):  # the other rank's flag is `other`
        other = 0.0

        def allreduce_sum(self, buf):
            buf += self.other
            return buf

    from nbqat.train.parallel import Parallel

    g = Sum(0)
    par = Parallel(g)
    intr = Interrupt(None, par.agree)
    assert not intr.step_done()
    g.other = 1.0  # the other rank got Ctrl-C
    assert intr.step_done() and intr.flag


def test_a_ctrl_c_outside_the_steps_ends_every_rank_with_status_130(capsys):
    # Ctrl-C to a rank during the evaluation (after the last step: no step agrees on it) ended
    # the run as a failure: "nbqat: rank 1 of 2 failed: KeyboardInterrupt", a traceback and
    # exit status 1, where one process (and a Ctrl-C during the steps) exits with 130.
    from nbqat.train.parallel import Parallel

    with pytest.raises(SystemExit) as e, Parallel(_Rank(1)).guard():
        raise KeyboardInterrupt
    assert e.value.code == 130
    err = capsys.readouterr().err
    assert "nbqat: rank 1 of 2 interrupted (Ctrl-C" in err and "Traceback" not in err
