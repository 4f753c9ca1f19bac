"""Property-based contract of ``nbqat train`` on malformed tables and arguments (hypothesis).

The contract (issue 20): for ANY table and options, the command either succeeds with finite,
reported results, or exits with status 2 and a one-line ``nbqat train: error:`` (or argparse
``usage``) message: never a traceback, and a failed run writes nothing. The bulk of the cases
run the validation pass only (``--check``: everything that is checked before training); a few
run end to end with tiny settings.

Oracle: the contract itself, plus, for accepted data, the arrays read back by an independent
route (csv module + float()) for the target column.
"""

from __future__ import annotations

import csv
import gzip
import io
import json
import math
import os
from datetime import datetime, timedelta
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from nbqat.cli import main

# A NumPy RuntimeWarning (invalid value, overflow) is how a silent NaN or inf starts: an error.
pytestmark = pytest.mark.filterwarnings("error::RuntimeWarning")

HEADER = ["id", "ts", "y", "x", "k"]
CELLS = ["", "NA", "abc", "1e300", "-1e300", "inf", "nan", "1,5", " 3 ", "0x10", "1e-320",
         "\u00e4", "7", "-0.0", "1e30", "true"]  # fmt: skip
STAMPS = ["+02:00", "Z", "17", "yesterday", "2020-13-01T00:00", "", " ", "2020-03-01", "inf",
          "1e308", "-5", "NaT"]  # fmt: skip
CASES = {"check": 0, "end_to_end": 0, "accepted": 0, "refused": 0}


def base_rows(n: int, seed: int) -> list[list[str]]:
    rng = np.random.default_rng(seed)
    out = []
    for ent in ("a", "b"):
        t0 = datetime(2020, 3, 1)
        for i in range(n):
            y = 10 + 5 * math.sin(2 * math.pi * i / 24) + rng.normal()
            out.append([ent, (t0 + timedelta(hours=i)).isoformat(), f"{y:.3f}",
                        f"{rng.normal():.3f}", str(i % 24)])  # fmt: skip
    return out


@st.composite
def tables(draw):
    n = draw(st.integers(60, 160))
    rows = base_rows(n, draw(st.integers(0, 3)))
    if draw(_mostly(st.just(False), st.just(True))):  # a numeric time axis (a step counter)
        step = draw(st.sampled_from([1, 0.5, 0.1, 3]))
        for k, r in enumerate(rows):
            r[1] = repr((k % n) * step)
    header = list(HEADER)
    for _ in range(draw(st.sampled_from([0, 0, 1, 1, 2, 4]))):
        kind = draw(st.sampled_from(["cell", "stamp", "delete", "dup", "swap", "field"]))
        i = draw(st.integers(0, len(rows) - 1))
        if kind == "cell":
            j = draw(st.integers(2, 4))
            if j < len(rows[i]):  # a "field" mutation may have shortened this row
                rows[i][j] = draw(st.sampled_from(CELLS))
        elif kind == "stamp":
            s = draw(st.sampled_from(STAMPS))
            rows[i][1] = rows[i][1] + s if s[:1] in "+Z" else s
        elif kind == "delete":
            del rows[i : i + draw(st.integers(1, 40))]
        elif kind == "dup":
            rows.insert(i, list(rows[i]))
        elif kind == "swap" and i + 1 < len(rows):
            rows[i], rows[i + 1] = rows[i + 1], rows[i]
        elif kind == "field":
            rows[i] = rows[i] + ["9"] if draw(st.booleans()) else rows[i][:-1]
        if not rows:
            rows = base_rows(5, 0)
    hdr = draw(_mostly(st.just("ok"), st.sampled_from(["dup", "bom", "rename", "empty"])))
    if hdr == "dup":
        header[3] = "y"
    elif hdr == "rename":
        header[2] = "Y"
    buf = io.StringIO()
    w = csv.writer(buf)
    if hdr != "empty":
        w.writerow(header)
        w.writerows(rows)
    text = ("\ufeff" if hdr == "bom" else "") + buf.getvalue()
    data = text.encode("utf-8")
    gz = draw(st.booleans())
    if gz:
        data = gzip.compress(data, mtime=0)
    if draw(st.integers(0, 9)) == 6:
        data = data[: draw(st.integers(0, len(data)))]
    return data, gz


def _mostly(good, bad):
    """A valid value most of the time, else a value from ``bad`` (hypothesis favours the
    boundaries of integer ranges, so the bad branch is an inner value)."""
    return st.integers(0, 9).flatmap(lambda i: bad if i == 6 else good)


@st.composite
def options(draw):
    hist = draw(_mostly(st.integers(24, 40), st.integers(1, 60)))
    opts = ["--history", str(hist)]
    opts += ["--horizon", str(draw(_mostly(st.integers(1, 8), st.integers(1, 30))))]
    opts += ["--batch-size", str(draw(_mostly(st.sampled_from([1, 8, 16]), st.just(10000))))]
    opts += ["--windows-per-epoch", str(draw(_mostly(st.sampled_from([0, 48]), st.just(4))))]
    cal = draw(_mostly(st.sampled_from(["hour,dow", "time_index"]), st.sampled_from(["hour", "x"])))
    opts += ["--calendar", cal]
    opts += ["--eval-stride", str(draw(st.integers(1, 50)))]
    if draw(st.booleans()):
        opts.append("--fill-gaps")
    if draw(_mostly(st.just(True), st.just(False))):
        opts += ["--entity-col", "id"]
    opts += ["--target-col", draw(_mostly(st.sampled_from(["y", "x"]), st.just("nope")))]
    if draw(st.booleans()):
        opts += ["--known-cols", draw(_mostly(st.just("k"), st.sampled_from(["k,x", "zz"])))]
    junk = [["--lr", "nan"], ["--max-norm", "0"], ["--epochs", "0"], ["--heads", "3"],
            ["--threads", "100000"], ["--device", "tpu"], ["--eval-stride", "-1"],
            ["--qat-lr", "inf"], ["--calendar", ""], ["--static-cols", "x"]]  # fmt: skip
    return opts + draw(_mostly(st.just([]), st.sampled_from(junk)))


def _contract(tmp: Path, data: bytes, gz: bool, opts: list[str], capsys, check: bool) -> int:
    p = tmp / ("d.csv.gz" if gz else "d.csv")
    p.write_bytes(data)
    out = tmp / "out"
    argv = ["train", "--csv", str(p), "--time-col", "ts", *opts, "--out", str(out)]
    argv += ["--check"] if check else ["--epochs", "1", "--qat-epochs", "1", "--hidden-dim",
                                       "4", "--heads", "1", "--calibration-batches", "1",
                                       "--no-progress", "--no-plots"]  # fmt: skip
    try:
        rc = main(argv)
    except SystemExit as e:  # argparse: usage errors
        rc = int(e.code or 0)
    cap = capsys.readouterr()
    CASES["accepted" if rc == 0 else "refused"] += 1
    assert "Traceback" not in cap.err
    if rc == 0:
        if check:
            assert "--check: OK" in cap.out and not out.exists()
        else:
            m = json.loads((out / "metrics.json").read_text(), parse_constant=_no_constant)
            for v in m["q_risk_test"].values():
                assert all(math.isfinite(x) and x >= 0 for x in v.values())
    else:
        assert rc == 2, cap.err
        first = cap.err.strip().splitlines()[-1]
        assert first.startswith(("nbqat train: error:", "nbqat train: error", "nbqat: error")) or (
            "usage:" in cap.err
        ), cap.err
        assert not out.exists()  # a failure writes nothing
    return rc


def _no_constant(c):
    raise AssertionError(f"metrics.json holds {c}")


def _accepted_target_matches(data: bytes, gz: bool, opts: list[str]) -> None:
    """For accepted data without repairs, the loader's target equals the csv-module read."""
    if "--fill-gaps" in opts or "--entity-col" not in opts:
        return
    text = (gzip.decompress(data) if gz else data).decode("utf-8-sig")
    rows = list(csv.DictReader(io.StringIO(text)))
    from nbqat.data import load_csv

    tcol = opts[opts.index("--target-col") + 1]
    ref = {}
    for r in rows:
        ref.setdefault(r["id"].strip(), []).append(float(r[tcol]))
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        f = Path(d) / ("t.csv.gz" if gz else "t.csv")
        f.write_bytes(data)
        sd = load_csv(f, time_col="ts", target_col=tcol, entity_col="id")
    for e, name in enumerate(sd.entity_names):
        np.testing.assert_array_equal(sd.target[e], ref[name])


@settings(
    max_examples=int(os.environ.get("NBQAT_HYPOTHESIS_EXAMPLES", 250)),
    deadline=None,
    suppress_health_check=list(HealthCheck),
)
@given(table=tables(), opts=options())
def test_validation_contract(tmp_path_factory, capsys, table, opts):
    data, gz = table
    tmp = tmp_path_factory.mktemp("h")
    CASES["check"] += 1
    if _contract(tmp, data, gz, opts, capsys, check=True) == 0:
        _accepted_target_matches(data, gz, opts)


def _clean() -> tuple[bytes, bool]:
    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow(HEADER)
    w.writerows(base_rows(120, 1))
    return buf.getvalue().encode(), False


_GOOD = ["--history", "24", "--horizon", "6", "--batch-size", "16", "--windows-per-epoch", "48",
         "--calendar", "hour,dow", "--eval-stride", "12", "--entity-col", "id",
         "--target-col", "y", "--known-cols", "k"]  # fmt: skip


@settings(max_examples=4, deadline=None, suppress_health_check=list(HealthCheck))
@given(table=tables(), opts=options())
@example(table=_clean(), opts=_GOOD)
def test_end_to_end_contract(tmp_path_factory, capsys, table, opts):
    data, gz = table
    CASES["end_to_end"] += 1
    _contract(tmp_path_factory.mktemp("e"), data, gz, opts, capsys, check=False)


# ------------------------------------------------------------------- tampered checkpoints

JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-(10**12), 10**12) | st.floats(allow_nan=False)
    | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner,
                                                                 max_size=3),
    max_leaves=6,
)  # fmt: skip


@pytest.fixture(scope="module")
def checkpoint_template(tmp_path_factory):
    out = tmp_path_factory.mktemp("ck") / "run"
    rc = main(["train", *_TINY_TRAIN, "--out", str(out), "--stop-after-steps", "4"])
    assert rc == 130
    return out


_TINY_TRAIN = ["--epochs", "2", "--qat-epochs", "1", "--batch-size", "16", "--hidden-dim", "4",
               "--heads", "1", "--history", "24", "--horizon", "6", "--windows-per-epoch", "48",
               "--calibration-batches", "2", "--eval-stride", "96", "--no-progress",
               "--no-plots"]  # fmt: skip


def _paths(node, prefix=()):
    if isinstance(node, dict):
        for k, v in node.items():
            yield prefix + (k,)
            yield from _paths(v, prefix + (k,))


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_tampered_state_json_contract(checkpoint_template, tmp_path_factory, capsys, data):
    import shutil

    run = tmp_path_factory.mktemp("t") / "run"
    shutil.copytree(checkpoint_template, run)
    ck = run / "checkpoint"
    meta = json.loads((ck / "state.json").read_text())
    original = json.loads((ck / "state.json").read_text())
    path = data.draw(st.sampled_from(sorted(_paths(meta), key=str)))
    node = meta
    for k in path[:-1]:
        node = node[k]
    if data.draw(st.booleans()):
        node[path[-1]] = data.draw(JSON_VALUES)
    else:
        del node[path[-1]]
    (ck / "state.json").write_text(json.dumps(meta))
    before = {p.name: p.read_bytes() for p in ck.iterdir()}
    CASES["checkpoint"] = CASES.get("checkpoint", 0) + 1
    try:
        rc = main(["train", "--resume", str(ck), "--check"])
    except SystemExit as e:
        rc = int(e.code or 0)
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert rc in (0, 2), err
    if meta != original:  # any edit is refused (a field check or the checksum)
        assert rc == 2 and err.startswith("nbqat train: error:") and "state.json" in err, err
    assert {p.name: p.read_bytes() for p in ck.iterdir()} == before


def test_report_case_counts(capsys):
    with capsys.disabled():
        print(f"\nhypothesis cases tried: {CASES}")
    if CASES["check"] >= 100:  # the generator reaches both sides of the contract
        assert CASES["accepted"] >= 5 and CASES["refused"] >= 5
