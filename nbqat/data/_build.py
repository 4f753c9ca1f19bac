"""Rebuild ``nbqat/data/tmy3_two_stations.csv.gz`` from the two NREL TMY3 files.

The shipped dataset is a reduction of two NREL TMY3 hourly weather files that pvlib-python
carries as test data (``pvlib/data/703165TY.csv``, Sand Point AK, and
``pvlib/data/723170TYA.CSV``, Greensboro NC). Run it with the pvlib data folder::

    python -m nbqat.data._build /path/to/pvlib/data

(for instance after ``pip download pvlib --no-deps`` and unzipping the wheel). The output is
deterministic (fixed gzip mtime), so a rebuild gives the same bytes.

What the reduction does (see ``nbqat/data/README.md``):

* keeps the columns used by the forecasting task (dry-bulb temperature, dew point, relative
  humidity, pressure, wind speed, total cloud cover, GHI, ETR) and the station header's latitude,
  longitude and elevation, in long format with a ``station`` column;
* replaces the TMY timestamps, whose year changes from month to month (a TMY file splices
  "typical" months taken from different years), by a continuous hourly index in the nominal
  non-leap year 2001, in local standard time. TMY3 labels each record with the END of its hour
  (``01:00`` ... ``24:00``); the reduced file labels it with the START of that hour, so that the
  8,760 records of a station run from ``2001-01-01T00:00`` to ``2001-12-31T23:00``. The values
  are not changed.
"""

from __future__ import annotations

import csv
import gzip
import io
import sys
from datetime import datetime, timedelta
from pathlib import Path

#: (TMY3 column, output column) pairs, in output order.
COLUMNS = (
    ("Dry-bulb (C)", "temp_air"),
    ("Dew-point (C)", "temp_dew"),
    ("RHum (%)", "relative_humidity"),
    ("Pressure (mbar)", "pressure"),
    ("Wspd (m/s)", "wind_speed"),
    ("TotCld (tenths)", "total_cloud"),
    ("GHI (W/m^2)", "ghi"),
    ("ETR (W/m^2)", "etr"),
)
#: The two TMY3 files and their short station names.
FILES = (("703165TY.csv", "sand_point_ak"), ("723170TYA.CSV", "greensboro_nc"))
#: Output file name (inside ``nbqat/data``).
OUTPUT = "tmy3_two_stations.csv.gz"
NOMINAL_YEAR = 2001


def reduce_tmy3(path: Path, station: str) -> list[list[str]]:
    """Rows of the reduced file for one TMY3 file (without the header)."""
    with open(path, newline="") as f:
        reader = csv.reader(f)
        meta = next(reader)
        header = next(reader)
        rows = list(reader)
    if len(rows) != 8760:
        raise ValueError(f"{path}: expected 8760 hourly records, found {len(rows)}")
    lat, lon, elev = meta[4], meta[5], meta[6]
    idx = [header.index(c) for c, _ in COLUMNS]
    start = datetime(NOMINAL_YEAR, 1, 1)
    out = []
    for i, r in enumerate(rows):
        # Check that the records are the consecutive hours of a (spliced) year: month/day/hour
        # must match the nominal calendar, whatever the source year.
        t = start + timedelta(hours=i)  # start of the hour
        end = t + timedelta(hours=1)
        mm, dd = int(r[0][:2]), int(r[0][3:5])
        hh = int(r[1][:2])
        exp_mm, exp_dd, exp_hh = (
            (t.month, t.day, 24) if end.hour == 0 else (end.month, end.day, end.hour)
        )
        if (mm, dd, hh) != (exp_mm, exp_dd, exp_hh):
            raise ValueError(f"{path}: record {i} is {r[0]} {r[1]}, not the expected hour")
        out.append([station, t.strftime("%Y-%m-%dT%H:%M")] + [r[j] for j in idx] + [lat, lon, elev])
    return out


def build(pvlib_data: Path, out_dir: Path) -> Path:
    """Write the reduced, gzip-compressed CSV and return its path."""
    header = ["station", "time"] + [c for _, c in COLUMNS] + ["latitude", "longitude", "elevation"]
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(header)
    for name, station in FILES:
        w.writerows(reduce_tmy3(pvlib_data / name, station))
    target = out_dir / OUTPUT
    with open(target, "wb") as raw:
        with gzip.GzipFile(filename="", mode="wb", fileobj=raw, compresslevel=9, mtime=0) as gz:
            gz.write(buf.getvalue().encode("ascii"))
    return target


if __name__ == "__main__":  # pragma: no cover - maintenance script
    if len(sys.argv) != 2:
        raise SystemExit("usage: python -m nbqat.data._build /path/to/pvlib/data")
    p = build(Path(sys.argv[1]), Path(__file__).resolve().parent)
    print(f"wrote {p} ({p.stat().st_size} bytes)")
