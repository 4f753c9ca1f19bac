"""Judge the default recipe on data it was not tuned on: the TMY2 file that pvlib ships.

``pvlib/data/12839.tm2`` (Miami, FL, WBAN 12839; NREL TMY2, U.S. government data; shipped in
the pvlib-python wheel, BSD-3-Clause) is converted to nbqat's long CSV layout and run through
``nbqat train --csv`` with the default options, so the summary compares the float, QAT and
int8 TFT with the seasonal naive and the ridge baseline on it. Not a pytest benchmark (its name
does not start with ``bench_``); nbqat does not ship the file.

Usage::

    pip download pvlib --no-deps -d /tmp/pvlib && unzip -o /tmp/pvlib/pvlib-*.whl \\
        'pvlib/data/12839.tm2' -d /tmp/pvlib
    python benchmarks/heldout_tmy2.py /tmp/pvlib/pvlib/data/12839.tm2 --out /tmp/heldout [...]

Extra arguments go to ``nbqat train``.
"""

from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path

# TMY2 fixed-width record (NREL/TP-463-7668, Table 3-1), as pvlib.iotools.read_tmy2 reads it:
# (name, digits) of the numeric fields; each field after the hour is followed by a 1-char
# source flag and a 1-digit uncertainty flag (the 10-char present-weather field has none).
_FIELDS = [
    ("year", 2), ("month", 2), ("day", 2), ("hour", 2), ("etr", 4), ("etrn", 4),
    ("ghi", 4), ("dni", 4), ("dhi", 4), ("ghillum", 4), ("dnillum", 4), ("dhillum", 4),
    ("zenithlum", 4), ("total_cloud", 2), ("opaque_cloud", 2), ("temp_air", 4),
    ("temp_dew", 4), ("relative_humidity", 3), ("pressure", 4), ("wind_dir", 3),
    ("wind_speed", 3),
]  # fmt: skip
_FLAGGED_FROM = "ghi"  # fields from here on carry the 2 flag characters
_SCALE = {"temp_air": 0.1, "temp_dew": 0.1, "wind_speed": 0.1, "total_cloud": 1.0}


def read_tm2(path: Path) -> list[dict]:
    """Hourly records of a TMY2 file (the first line is the station header)."""
    lines = path.read_text().splitlines()[1:]
    rows = []
    for line in lines:
        pos, rec, flagged = 1, {}, False  # column 0 is a blank
        for name, width in _FIELDS:
            flagged = flagged or name == _FLAGGED_FROM
            rec[name] = int(line[pos : pos + width]) * _SCALE.get(name, 1.0)
            pos += width + (2 if flagged else 0)
        rows.append(rec)
    return rows


def to_csv(rows: list[dict], out: Path) -> None:
    """Write nbqat's long layout; TMY hour 1-24 is the hour ending, i.e. starting at hour-1."""
    cols = ["temp_air", "temp_dew", "relative_humidity", "pressure", "wind_speed"]
    cols += ["total_cloud", "ghi", "etr"]
    with out.open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["station", "time", *cols])
        for r in rows:
            t = f"2001-{int(r['month']):02d}-{int(r['day']):02d}T{int(r['hour']) - 1:02d}:00"
            w.writerow(["miami_fl", t, *(f"{r[c]:g}" for c in cols)])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("tm2", type=Path)
    ap.add_argument("--out", default="heldout-tmy2")
    a, rest = ap.parse_known_args(argv)
    from nbqat.cli import main as nbqat_main

    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    csv_path = out / "miami_tmy2.csv"
    to_csv(read_tm2(a.tm2), csv_path)
    args = ["train", "--csv", str(csv_path), "--time-col", "time", "--target-col", "temp_air"]
    args += ["--entity-col", "station", "--known-cols", "etr", "--out", str(out / "run")]
    return nbqat_main(args + rest)


if __name__ == "__main__":
    sys.exit(main())
