"""benchmarks/heldout.py's conversions on tiny synthetic files of each format.

The expected rows are written by hand from the synthetic inputs (the formats' documented
layouts), not produced by the converters; each converted file is also read back through
``nbqat.data.load_csv`` with the set's own train arguments.
"""

from __future__ import annotations

import csv
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import heldout  # noqa: E402
from _heldout_sources import package_bytes  # noqa: E402

from nbqat.data import load_csv  # noqa: E402


def _rows(path: Path) -> list[list[str]]:
    with path.open(newline="") as fh:
        return list(csv.reader(fh))


def _load(path: Path, name: str):
    """load_csv with the set's --time-col / --target-col / --entity-col / --known-cols."""
    a = list(heldout.DATASETS[name].train_args)
    opt = {k: a[a.index(k) + 1] for k in ("--target-col", "--entity-col", "--known-cols") if k in a}
    return load_csv(
        path,
        time_col="time",
        target_col=opt["--target-col"],
        entity_col=opt.get("--entity-col"),
        known_cols=opt.get("--known-cols"),
        fill_gaps="--fill-gaps" in a,
    )


def test_seattle_weather(tmp_path):
    raw = b"date,precipitation,temp_max,temp_min,wind,weather\n"
    raw += b"2012/01/01,0.0,12.8,5.0,4.7,drizzle\n2012/01/02,10.9,10.6,2.8,4.5,rain\n"
    out = tmp_path / "s.csv"
    heldout.seattle_weather(raw, out)
    assert _rows(out) == [
        ["time", "temp_max", "temp_min", "precipitation", "wind"],
        ["2012-01-01", "12.8", "5.0", "0.0", "4.7"],
        ["2012-01-02", "10.6", "2.8", "10.9", "4.5"],
    ]
    d = _load(out, "seattle_weather")
    assert d.step == np.timedelta64(1, "D")


def test_taylor(tmp_path):
    values = list(range(1000, 2010))  # > 1000 values: the long literal
    src = "import numpy as np\n\ndef load_taylor():\n    x = [1, 2]\n"
    src += f"    rslt = np.array({values!r}).astype(float)\n    return rslt\n"
    out = tmp_path / "t.csv"
    heldout.taylor(src.encode(), out)
    rows = _rows(out)
    assert rows[0] == ["time", "demand"]
    assert rows[1] == ["2000-06-05T00:00", "1000"]
    assert rows[3] == ["2000-06-05T01:00", "1002"]
    assert rows[49] == ["2000-06-06T00:00", "1048"]  # 48 half-hours a day
    assert len(rows) == 1 + len(values)
    assert _load(out, "taylor").step == np.timedelta64(30, "m")


def test_taylor_without_literal_is_an_error(tmp_path):
    with pytest.raises(ValueError, match="one long list literal"):
        heldout.taylor(b"x = [1, 2, 3]\n", tmp_path / "t.csv")


def _tm2_line(hour: int, ghi: int, temp: int) -> str:
    """One TMY2 record: blank, yy mm dd hh, etr etrn (no flags), then flagged fields (value
    + source flag + uncertainty digit), per NREL/TP-463-7668 Table 3-1."""
    head = " 86" + "01" + "15" + f"{hour:02d}" + "1000" + "1300"
    flagged = [
        (ghi, 4), (0, 4), (0, 4), (0, 4), (0, 4), (0, 4), (0, 4), (7, 2), (3, 2),
        (temp, 4), (180, 4), (75, 3), (1015, 4), (90, 3), (55, 3),
    ]  # fmt: skip
    return head + "".join(f"{v:>{n}d}A7" for v, n in flagged)


def test_miami_ghi(tmp_path):
    text = "12839 MIAMI FL -5 N 25 48 W 80 16 2\n"
    text += "\n".join(_tm2_line(h, 10 * h, 250 + h) for h in range(1, 25)) + "\n"
    out = tmp_path / "m.csv"
    heldout.miami_ghi(text.encode(), out)
    rows = _rows(out)
    assert rows[0] == ["station", "time", *heldout.GHI_COLUMNS]
    # hour 1 (hour ending 01:00) starts at 00:00; temp in 0.1 deg C, wind in 0.1 m/s
    assert rows[1] == ["miami", "2001-01-15T00:00", "10", "25.1", "18", "75", "1015", "5.5", "7",
                       "1000"]  # fmt: skip
    assert rows[24][:3] == ["miami", "2001-01-15T23:00", "240"]
    assert len(rows) == 25
    d = _load(out, "miami_ghi")
    assert d.step == np.timedelta64(1, "h")


def test_us_employment(tmp_path):
    raw = b"month,nonfarm,private,nonfarm_change\n2006-01-01,100,80,5\n2006-02-01,101,81,1\n"
    out = tmp_path / "u.csv"
    heldout.us_employment(raw, out)
    assert _rows(out) == [
        ["series", "time", "value"],
        ["nonfarm", "0", "100"], ["nonfarm", "1", "101"],
        ["private", "0", "80"], ["private", "1", "81"],
    ]  # fmt: skip
    assert _load(out, "us_employment").entity_names == ["nonfarm", "private"]


def test_co2_keeps_the_gap_for_fill_gaps(tmp_path):
    raw = b"date,co2\n19580329,316.1\n19580405,\n19580412,317.5\n"
    raw += b"".join(b"1958%s,318.0\n" % d for d in (b"0419", b"0426", b"0503", b"0510", b"0517"))
    out = tmp_path / "c.csv"
    heldout.co2(raw, out)
    rows = _rows(out)
    assert rows[:4] == [
        ["time", "co2"], ["1958-03-29", "316.1"], ["1958-04-05", ""], ["1958-04-12", "317.5"]
    ]  # fmt: skip
    assert rows[-1] == ["1958-05-17", "318.0"]  # 1 gap in 8 weeks
    d = _load(out, "co2")
    assert d.step == np.timedelta64(7, "D")
    assert d.filled  # the empty week was repaired (--fill-gaps)


def test_package_bytes_reads_a_wheel_and_names_the_fix(tmp_path):
    with zipfile.ZipFile(tmp_path / "fakepkg-1.0-py3-none-any.whl", "w") as z:
        z.writestr("fakepkg/data/x.csv", "a,b\n1,2\n")
    assert package_bytes("fakepkg", "fakepkg/data/x.csv", tmp_path) == b"a,b\n1,2\n"
    with pytest.raises(FileNotFoundError, match="pip download --no-deps -d WHEELS fakepkg"):
        package_bytes("fakepkg", "fakepkg/data/missing.csv", tmp_path)


def _metrics(float_p50: float, ridge_p50: float, p: float) -> dict:
    qr = {k: {"P50": v} for k, v in [("seasonal_naive", 2.0), ("ridge", ridge_p50),
                                     ("float", float_p50), ("int8", 1.01 * float_p50),
                                     ("float_finetuned", float_p50)]}  # fmt: skip
    sig = {f"{m}_vs_ridge_P50": {"p_value_hln": p} for m in ("float", "int8")}
    return {"q_risk_test": qr, "significance": sig, "data": {"windows": {"test": 9}}}


def test_table_gain_mean_and_goal(tmp_path):
    import json

    from _heldout_table import table

    for seed, f in enumerate((0.88, 0.95, 1.0)):  # gains 12 %, 5 %, 0 % over ridge 1.0
        d = tmp_path / "toy" / f"seed{seed}"
        d.mkdir(parents=True)
        (d / "metrics.json").write_text(json.dumps(_metrics(f, 1.0, 0.5)))
        (d / "timings.json").write_text(json.dumps({"phases_s": {"total": 60.0 + seed}}))
    (tmp_path / "peers.jsonl").write_text('{"set": "toy", "q_risk_test": {"P50": 1.25}}\n')
    last = table(tmp_path, ["toy", "absent"]).splitlines()[-1]
    assert last.startswith("| `toy` | 9 | 2 | 1 | 1.25 | 0.88 / 0.95 / 1 |")
    assert "+12.0 % (p 0.5) / +5.0 % (p 0.5) / +0.0 % (p 0.5) | +5.7 % |" in last
    assert "+1.00 % / +1.00 % / +1.00 %" in last and "| 60 / 61 / 62 | met |" in last


def test_epw_reader_units_and_missing_columns():
    from _heldout_weather import read_epw

    def line(hour: int, cloud: float) -> str:
        f = ["2005", "3", "1", str(hour), "60", "?"] + ["0"] * 29
        f[6], f[7], f[8], f[9], f[10], f[13], f[21], f[22] = (
            "12.5", "3.0", "55", "101325", "800", "400", "4.2", str(cloud)
        )  # fmt: skip
        return ",".join(f)

    head = ["LOCATION,Test Town,,NLD,IWEC,062400,52.3,4.77,1.0,-2.0"] + ["X"] * 7
    name, rows = read_epw("\n".join([*head, line(1, 5), line(2, 99)]) + "\n", "stem")
    assert name == "test_town"
    assert rows[0]["pressure"] == 1013.25  # Pa -> mbar
    assert (rows[0]["temp_air"], rows[1]["hour"], rows[0]["ghi"]) == (12.5, 2, 400.0)
    assert "total_cloud" not in rows[0]  # 99 (the missing code) somewhere drops the column
