"""The weather files of pvlib that :mod:`heldout` converts: NREL TMY2 and EnergyPlus (EPW).

Each file is one year of hourly observations at one station; :func:`to_csv` writes it in
nbqat's long CSV layout. ``python benchmarks/heldout.py weather FILE`` runs the default recipe
on one such file (the three-station temperature table of the README); the held-out collection
uses the TMY2 file of Miami (``12839.tm2``, in the pvlib wheel) for its solar-irradiance set.

* ``12839.tm2`` -- Miami, FL (WBAN 12839), NREL TMY2, U.S. government data; in the pvlib wheel
  (``pvlib/data/``).
* ``NLD_Amsterdam062400_IWEC.epw`` -- Amsterdam Schiphol (WMO 062400), ASHRAE IWEC typical
  year, EnergyPlus weather format; in the pvlib source distribution (``tests/data/``).
* ``tmy_45.000_8.000_2005_2023.epw`` -- PVGIS typical year at 45 N, 8 E (Piedmont, Italy;
  ERA5 reanalysis, European Commission JRC), EnergyPlus weather format; same place.

pvlib-python is BSD-3-Clause; each data file keeps its provider's terms (see its header).
"""

from __future__ import annotations

import csv
from pathlib import Path

#: Every file becomes these columns (those a file lacks are left out): target first.
COLUMNS = ["temp_air", "temp_dew", "relative_humidity", "pressure", "wind_speed"]
COLUMNS += ["total_cloud", "ghi", "etr"]

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

# EnergyPlus weather (EPW) data fields (EnergyPlus "Auxiliary Programs", Weather Converter,
# data dictionary), as pvlib.iotools.read_epw names them: column -> (field index, missing code).
_EPW = {
    "temp_air": (6, 99.9), "temp_dew": (7, 99.9), "relative_humidity": (8, 999.0),
    "pressure": (9, 999999.0), "etr": (10, 9999.0), "ghi": (13, 9999.0),
    "wind_speed": (21, 999.0), "total_cloud": (22, 99.0),
}  # fmt: skip
_EPW_PA_PER_MBAR = 100.0  # EPW pressure is in Pa; TMY2's (and the shipped data's) in mbar


def read_tm2(text: str) -> tuple[str, list[dict]]:
    """(station name, hourly records) of a TMY2 file's text (the first line is the station
    header)."""
    lines = text.splitlines()
    rows = []
    for line in lines[1:]:
        pos, rec, flagged = 1, {}, False  # column 0 is a blank
        for name, width in _FIELDS:
            flagged = flagged or name == _FLAGGED_FROM
            rec[name] = int(line[pos : pos + width]) * _SCALE.get(name, 1.0)
            pos += width + (2 if flagged else 0)
        rows.append(rec)
    return lines[0].split()[1].lower(), rows


def read_epw(text: str, stem: str = "station") -> tuple[str, list[dict]]:
    """(station name, hourly records) of an EPW file (8 header lines, then one line an hour).

    A field that holds its missing-value code somewhere is left out of every record."""
    lines = text.splitlines()
    station = lines[0].split(",")[1].strip().lower().replace(" ", "_")
    if station in ("", "unknown"):
        station = stem.lower()
    fields = [line.split(",") for line in lines[8:] if line.strip()]
    rows = []
    for f in fields:
        rec = {"month": int(f[1]), "day": int(f[2]), "hour": int(f[3])}
        rec.update({c: float(f[i]) for c, (i, _) in _EPW.items()})
        rec["pressure"] /= _EPW_PA_PER_MBAR
        rows.append(rec)
    for c, (_, missing) in _EPW.items():
        scale = _EPW_PA_PER_MBAR if c == "pressure" else 1.0
        if any(r[c] * scale >= missing for r in rows):
            for r in rows:
                del r[c]
    return station, rows


def to_csv(station: str, rows: list[dict], out: Path, columns: list[str] = COLUMNS) -> list[str]:
    """Write nbqat's long layout (TMY hour 1-24 is the hour ending, i.e. the row starts at
    hour - 1); return the columns written after ``station`` and ``time``."""
    cols = [c for c in columns if c in rows[0]]
    with out.open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["station", "time", *cols])
        for r in rows:
            t = f"2001-{int(r['month']):02d}-{int(r['day']):02d}T{int(r['hour']) - 1:02d}:00"
            w.writerow([station, t, *(f"{r[c]:g}" for c in cols)])
    return cols
