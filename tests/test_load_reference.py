"""load_csv's output, bit for bit, against a slow reference loader (issue 16's fast paths).

The reference reads every cell as text with pandas' C parser (``dtype=str``, not pyarrow),
converts it with Python's ``float`` and ``datetime.fromisoformat``, and groups the rows by the
stripped entity name in order of first appearance with plain Python lists. The files are read
in small blocks (``_arrow._BLOCK_BYTES``), so every column comes in many chunks, entity
boundaries fall inside chunks, and entities first appear in later chunks (the dictionary
entity path unifies the chunks' dictionaries).
"""

from __future__ import annotations

import csv
from datetime import datetime, timedelta
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from nbqat.data import DataError, _arrow, from_dataframe, load_csv, load_tmy3, tmy3_path
from nbqat.data._tmy3 import TMY3_COLUMNS

ROLES = dict(
    time_col="time",
    target_col="temp_air",
    entity_col="station",
    known_cols=["etr"],
    static_cols=["latitude", "longitude", "elevation"],
)
OBSERVED = ["temp_dew", "relative_humidity", "pressure", "wind_speed", "ghi"]
#: pandas' correctly rounded float parser: the default from pandas 3, where the option that asks
#: for it in pandas 2 (``float_precision="round_trip"``) is deprecated
EXACT_FLOATS = {"float_precision": "round_trip"} if pd.__version__.startswith("2.") else {}


def reference(path: Path, time_col, target_col, entity_col, known_cols, static_cols, observed):
    """A slow, obvious loader for gap-free files: per entity, the values in file order."""
    raw = pd.read_csv(path, dtype=str, keep_default_na=False, engine="c")
    groups: dict[str, list[int]] = {}
    for i, name in enumerate(raw[entity_col]):
        groups.setdefault(name.strip(), []).append(i)
    out: dict = {"names": list(groups), "target": [], "observed": [], "known": [], "times": []}
    static = []
    for rows in groups.values():

        def cell(c: str, rows: list[int] = rows) -> list[float]:
            return [float(raw[c].iloc[i]) for i in rows]

        out["target"].append(np.array(cell(target_col)))
        out["observed"].append(np.array([cell(c) for c in observed]).T.reshape(len(rows), -1))
        out["known"].append(np.array([cell(c) for c in known_cols]).T.reshape(len(rows), -1))
        ts = [datetime.fromisoformat(raw[time_col].iloc[i]) for i in rows]
        step = ts[1] - ts[0]
        assert all(b - a == step for a, b in zip(ts, ts[1:]))  # the files here are regular
        out["times"].append(np.array([np.datetime64(t, "s") for t in ts]))
        static.append([cell(c)[0] for c in static_cols])
    out["static"] = np.array(static).reshape(len(groups), len(static_cols))
    out["step"] = np.timedelta64(step, "s")
    return out


def same(a: np.ndarray, b: np.ndarray) -> None:
    """Equal bit for bit (``-0.0`` is not ``0.0``), same dtype, shape and C order."""
    assert a.dtype == b.dtype and a.shape == b.shape and a.flags.c_contiguous
    assert a.tobytes() == b.tobytes()


def check(d, ref) -> None:
    assert d.entity_names == ref["names"]
    assert d.step == ref["step"] and d.step.dtype == ref["step"].dtype
    same(d.static, ref["static"])
    for e in range(len(ref["names"])):
        for key in ("target", "observed", "known", "times"):
            same(getattr(d, key)[e], ref[key][e])
    assert d.n_filled == 0 and d.filled == {}


def bench_like(n_series: int, n_hours: int, seed: int = 0) -> list[list[str]]:
    """Rows like benchmarks/bench_data.py's file: floats of every length, integers, ``-0``,
    entity names with stray spaces on some rows (one entity after stripping)."""
    rng = np.random.default_rng(seed)
    t0 = datetime(2001, 1, 1)
    body = []
    for s in range(n_series):
        lat, lon, elev = repr(rng.uniform(25, 60)), f"{rng.uniform(-160, -70):.3f}", "-0"
        for h in range(n_hours):
            name = f"station_{s:03d}"
            name = {0: f" {name}", 1: f"{name} "}.get(int(rng.integers(0, 8)), name)
            body.append([
                name,
                (t0 + timedelta(hours=h)).strftime("%Y-%m-%dT%H:%M"),
                f"{rng.normal(10, 8):.1f}",
                repr(float(rng.normal(5, 6))),
                str(rng.integers(10, 100)),
                str(rng.integers(950, 1040)),
                "-0" if h % 17 == 0 else f"{rng.gamma(2, 2):.3g}",
                str(rng.integers(0, 1000)),
                str(rng.integers(0, 1400)),
                lat,
                lon,
                elev if s % 2 else str(s * 100),
            ])  # fmt: skip
    return body


HEADER = ["station", "time", "temp_air", "temp_dew", "relative_humidity", "pressure"]
HEADER += ["wind_speed", "ghi", "etr", "latitude", "longitude", "elevation"]


def write(path: Path, body: list[list[str]]) -> Path:
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(HEADER)
        w.writerows(body)
    return path


@pytest.fixture
def small_blocks(monkeypatch):
    monkeypatch.setattr(_arrow, "_BLOCK_BYTES", 1 << 12)


def test_shipped_file_matches_the_reference():
    observed = list(TMY3_COLUMNS["observed_cols"])
    roles = {k: v for k, v in TMY3_COLUMNS.items() if k != "observed_cols"}
    check(load_tmy3(), reference(tmy3_path(), **roles, observed=observed))


def test_bench_like_file_in_many_chunks_matches_the_reference(tmp_path, small_blocks):
    body = bench_like(7, 300)
    p = write(tmp_path / "b.csv", body)
    table = _arrow.read_table(p, HEADER, "station", False, HEADER[2:]).table
    assert table.column("station").num_chunks > 20  # many chunks, 300-row entities
    ref = reference(p, **ROLES, observed=OBSERVED)
    assert ref["names"] == [f"station_{s:03d}" for s in range(7)]
    check(load_csv(p, **ROLES, observed_cols=OBSERVED), ref)


def test_interleaved_entities_in_many_chunks_match_the_reference(tmp_path, small_blocks):
    body = bench_like(5, 200, seed=1)
    mixed = [body[s * 200 + h] for h in range(200) for s in (3, 0, 4, 1, 2)]
    p = write(tmp_path / "m.csv", mixed)
    ref = reference(p, **ROLES, observed=OBSERVED)
    assert ref["names"] == [f"station_{s:03d}" for s in (3, 0, 4, 1, 2)]
    check(load_csv(p, **ROLES, observed_cols=OBSERVED), ref)
    # the same rows, each entity's block starting in a later chunk than the one before
    late = [r for s in (3, 0, 4, 1, 2) for r in body[s * 200 : (s + 1) * 200]]
    check(load_csv(write(tmp_path / "g.csv", late), **ROLES, observed_cols=OBSERVED), ref)


def test_parquet_and_dataframe_match_the_reference(tmp_path):
    body = bench_like(4, 150, seed=2)
    for r in body:  # an integer column read by pandas has no -0
        r[11] = "0" if r[11] == "-0" else r[11]
    p = write(tmp_path / "b.csv", body)
    ref = reference(p, **ROLES, observed=OBSERVED)
    # integer columns stay int64, the entity column plain strings; EXACT_FLOATS: pandas < 3's
    # default float parser can be an ulp off the correctly rounded value the reference reads
    df = pd.read_csv(p, **EXACT_FLOATS)
    assert df["ghi"].dtype == np.int64
    df.to_parquet(tmp_path / "b.parquet", row_group_size=97)  # several chunks
    check(load_csv(tmp_path / "b.parquet", **ROLES, observed_cols=OBSERVED), ref)
    df["time"] = pd.to_datetime(df["time"])
    check(from_dataframe(df, **ROLES, observed_cols=OBSERVED), ref)


def test_first_appearance_matches_a_python_reference():
    rng = np.random.default_rng(3)
    raw = [" b", "a", "c ", "b", "unused", "d", "a "]
    values = [v.strip() for v in raw]  # as entity_codes strips the dictionary
    for _ in range(20):
        codes = rng.choice([0, 1, 2, 3, 5, 6], size=int(rng.integers(1, 40))).astype(np.int32)
        names: list[str] = []
        expect = []
        for c in codes:  # the obvious way: strip, then number by first appearance
            v = values[c].strip()
            if v not in names:
                names.append(v)
            expect.append(names.index(v))
        got_codes, got_names = _arrow._first_appearance(codes, values)
        assert got_names == names
        np.testing.assert_array_equal(got_codes, expect)


def test_errors_in_later_chunks_name_their_line(tmp_path, small_blocks):
    body = bench_like(5, 200, seed=4)
    mixed = [body[s * 200 + h] for h in range(200) for s in range(5)]
    mixed[613][10] = "0.5"  # a static value that changes within entity 3 (interleaved)
    with pytest.raises(DataError, match=r"line 615: static column 'longitude' changes within "
                       r"entity 'station_003'"):  # fmt: skip
        load_csv(write(tmp_path / "s.csv", mixed), **ROLES, observed_cols=OBSERVED)
    body[650][9] = "0.5"  # the same in the grouped file: entity 3's row 50, mid-chunk
    msg = r"line 652: static column 'latitude' changes within entity 'station_003' \("
    with pytest.raises(DataError, match=msg + r"[0-9.]+ then 0.5\)"):  # not np.float64(0.5)
        load_csv(write(tmp_path / "s2.csv", body), **ROLES, observed_cols=OBSERVED)
    body[650][9] = body[649][9]
    body[777][5] = "1e31"
    with pytest.raises(DataError, match=r"line 779: column 'pressure' has a huge value 1e\+31"):
        load_csv(write(tmp_path / "h.csv", body), **ROLES, observed_cols=OBSERVED)


def test_fill_gaps_repairs_cells_in_place_across_chunks(tmp_path, small_blocks):
    body = bench_like(3, 200, seed=5)
    body[250][3] = ""  # temp_dew (observed) of entity 1, its row 50
    body[251][3] = "NaN"  # and its row 51
    body[420][8] = "NA"  # etr (known) of entity 2, its row 20
    p = write(tmp_path / "f.csv", body)
    d = load_csv(p, **ROLES, observed_cols=OBSERVED, fill_gaps=True)
    assert d.filled == {"station_001": {"temp_dew": 2}, "station_002": {"etr": 1}}
    a = float(body[249][3])  # observed: its last value carried (no look past the gap)
    np.testing.assert_array_equal(d.observed[1][50:52, 0], [a, a])
    assert d.known[2][20, 0] == pytest.approx((float(body[419][8]) + float(body[421][8])) / 2)
    for r in (250, 251, 420):
        body[r][3 if r < 400 else 8] = "0"
    ref = reference(write(tmp_path / "ok.csv", body), **ROLES, observed=OBSERVED)
    untouched = np.ones(200, bool)
    untouched[50:52] = False
    same(d.target[1], ref["target"][1])
    np.testing.assert_array_equal(d.observed[1][untouched], ref["observed"][1][untouched])
    same(d.observed[0], ref["observed"][0])


@pytest.mark.parametrize("value", ["NaN", "nan", "-nan", "NA", "N/A", "#N/A", "NULL", "null", ""])
def test_null_spellings_are_missing_values(tmp_path, value):
    body = bench_like(2, 60, seed=6)
    bad = [r[:] for r in body]
    bad[70][3] = value  # temp_dew of entity 1, its row 10
    p = write(tmp_path / "n.csv", bad)
    with pytest.raises(DataError, match=r"line 72: column 'temp_dew' has a missing value"):
        load_csv(p, **ROLES, observed_cols=OBSERVED)
    d = load_csv(p, **ROLES, observed_cols=OBSERVED, fill_gaps=True)
    assert d.filled == {"station_001": {"temp_dew": 1}}
    assert d.observed[1][10, 0] == float(body[69][3])  # its last value carried
    bad = [r[:] for r in body]
    bad[5][1] = value  # a time stamp
    msg = r"line 7: column 'time' \(--time-col\) has a missing value"
    with pytest.raises(DataError, match=msg):
        load_csv(write(tmp_path / "t.csv", bad), **ROLES, observed_cols=OBSERVED)
    steps = [[str(i), r[2]] for i, r in enumerate(body)]  # a numeric time column
    steps[5][0] = value
    p = tmp_path / "s.csv"
    p.write_text("t,v\n" + "\n".join(",".join(r) for r in steps) + "\n")
    with pytest.raises(DataError, match=msg.replace("'time'", "'t'")):
        load_csv(p, time_col="t", target_col="v")


def test_parquet_categorical_entities_in_first_appearance_order(tmp_path):
    body = bench_like(3, 80, seed=7)
    for r in body:
        r[11] = "0" if r[11] == "-0" else r[11]
    p = write(tmp_path / "c.csv", body)
    ref = reference(p, **ROLES, observed=OBSERVED)
    df = pd.read_csv(p, **EXACT_FLOATS)  # correctly rounded, as the reference
    df["station"] = df["station"].str.strip()
    order = ["unused", "station_002", "station_000", "station_001"]  # not appearance order
    df["station"] = pd.Categorical(df["station"], categories=order)
    df.to_parquet(tmp_path / "c.parquet", row_group_size=50)
    check(load_csv(tmp_path / "c.parquet", **ROLES, observed_cols=OBSERVED), ref)
