"""Judge the default recipe on data it was never tuned on: a held-out collection of 5 sets.

Each set is a file that ships inside a package on PyPI, converted to nbqat's long CSV layout
and run through ``nbqat train --csv`` with the default recipe: only the columns, the horizon,
the history (where the default does not fit the step) and the calendar are given, chosen from
the data's step before any run (never from a result). The summary and ``metrics.json`` then
compare the float, QAT and int8 TFT with the seasonal naive and the validation-tuned ridge.

* ``seattle_weather`` -- daily maximum temperature, Seattle 2012-2015, with the minimum
  temperature, precipitation and wind as observed inputs (vega_datasets,
  ``seattle-weather.csv``; NOAA): daily, one series, observed covariates.
* ``taylor`` -- half-hourly electricity demand of England and Wales, 5 June - 27 August 2000
  (pmdarima, ``datasets/taylor.py``; Taylor 2003): half-hourly, one series, no covariates.
* ``miami_ghi`` -- hourly global horizontal irradiance of the Miami TMY2 year, the
  extraterrestrial radiation known in advance (pvlib, ``data/12839.tm2``): hourly, one
  series, a known covariate (and observed weather).
* ``us_employment`` -- monthly U.S. employment by sector 2006-2015, 22 series (vega_datasets,
  ``us-employment.csv``; BLS), the month counted from 0: monthly, many series, no covariates.
* ``co2`` -- weekly atmospheric CO2 at Mauna Loa 1958-2001 with 59 missing weeks (statsmodels,
  ``datasets/co2/co2.csv``): weekly, one series, gaps (``--fill-gaps`` repairs them).

The files are read from the installed packages or, without them, from their wheels in a
folder (nothing is committed to nbqat)::

    pip download --no-deps -d /tmp/heldout-wheels vega_datasets==0.9.0 statsmodels==0.15.0 \\
        pmdarima==2.1.1 pvlib==0.16.1
    python benchmarks/heldout.py run seattle_weather --wheels /tmp/heldout-wheels \\
        --out /tmp/heldout -- --seed 0 --threads 1
    python benchmarks/heldout.py table /tmp/heldout        # the README's table

``run NAME`` converts the set to ``OUT/NAME.csv`` and trains into ``OUT/NAME/seed<S>``
(arguments after ``--`` go to ``nbqat train``); ``convert`` only writes the CSVs and prints the
train commands; ``weather FILE`` runs one TMY2/EPW weather file as before (the README's
three-station temperature table). Not a pytest benchmark (its name does not start with
``bench_``). Licences: vega_datasets BSD-3-Clause (the Seattle weather from NOAA, the
employment figures from the U.S. Bureau of Labor Statistics), pmdarima MIT (the taylor series
from R's forecast package, GPL-3, after Taylor 2003), pvlib BSD-3-Clause (TMY2: U.S.
government data), statsmodels BSD-3-Clause (CO2: NOAA/Scripps, public domain).
"""

from __future__ import annotations

import argparse
import csv
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _heldout_sources import package_bytes  # noqa: E402
from _heldout_table import table  # noqa: E402
from _heldout_weather import read_epw, read_tm2, to_csv  # noqa: E402


@dataclass(frozen=True)
class Dataset:
    """One held-out set: where its file ships, how it converts, its ``nbqat train`` columns."""

    dist: str  # the PyPI distribution
    member: str  # the file's path inside the wheel (and the installed package)
    convert: Callable[[bytes, Path], None]
    train_args: tuple[str, ...]


def seattle_weather(raw: bytes, out: Path) -> None:
    """``date,precipitation,temp_max,temp_min,wind,weather`` -> daily rows, target first (the
    text column ``weather`` is left out)."""
    rows = list(csv.DictReader(raw.decode().splitlines()))
    with out.open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["time", "temp_max", "temp_min", "precipitation", "wind"])
        for r in rows:
            t = r["date"].replace("/", "-")
            w.writerow([t, r["temp_max"], r["temp_min"], r["precipitation"], r["wind"]])


def taylor(raw: bytes, out: Path) -> None:
    """The ``np.array([...])`` literal of pmdarima's ``taylor.py`` (4032 half-hours from
    Monday 5 June 2000, 00:00) -> ``time,demand`` rows."""
    import ast

    import numpy as np

    tree = ast.parse(raw.decode())
    lists = [n for n in ast.walk(tree) if isinstance(n, ast.List) and len(n.elts) > 1000]
    if len(lists) != 1:
        raise ValueError(f"expected one long list literal in taylor.py, found {len(lists)}")
    values = ast.literal_eval(lists[0])
    times = np.datetime64("2000-06-05T00:00") + np.arange(len(values)) * np.timedelta64(30, "m")
    with out.open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["time", "demand"])
        w.writerows([str(t), v] for t, v in zip(times, values))


#: miami_ghi's columns: the target (global horizontal irradiance) first, ``etr`` known.
GHI_COLUMNS = ["ghi", "temp_air", "temp_dew", "relative_humidity", "pressure", "wind_speed"]
GHI_COLUMNS += ["total_cloud", "etr"]


def miami_ghi(raw: bytes, out: Path) -> None:
    """The TMY2 file -> hourly rows with the irradiance as the target."""
    to_csv(*read_tm2(raw.decode()), out, columns=GHI_COLUMNS)


def us_employment(raw: bytes, out: Path) -> None:
    """The wide monthly table (one column a sector) -> long rows ``series,time,value`` with the
    month counted from January 2006 (0, 1, ...); ``nonfarm_change`` (a difference of
    ``nonfarm``) is left out."""
    rows = list(csv.DictReader(raw.decode().splitlines()))
    series = [c for c in rows[0] if c not in ("month", "nonfarm_change")]
    with out.open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["series", "time", "value"])
        for s in series:
            w.writerows([s, i, r[s]] for i, r in enumerate(rows))


def co2(raw: bytes, out: Path) -> None:
    """``date,co2`` (``yyyymmdd``, an empty value where the week is missing) -> weekly rows."""
    rows = list(csv.DictReader(raw.decode().splitlines()))
    with out.open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["time", "co2"])
        for r in rows:
            d = r["date"]
            w.writerow([f"{d[:4]}-{d[4:6]}-{d[6:8]}", r["co2"]])


DATASETS: dict[str, Dataset] = {
    "seattle_weather": Dataset(
        "vega_datasets", "vega_datasets/_data/seattle-weather.csv", seattle_weather,
        ("--target-col", "temp_max", "--horizon", "7", "--calendar", "dow,doy"),
    ),
    "taylor": Dataset(
        "pmdarima", "pmdarima/datasets/taylor.py", taylor,
        ("--target-col", "demand", "--horizon", "48", "--calendar", "hour,dow"),
    ),
    "miami_ghi": Dataset(
        "pvlib", "pvlib/data/12839.tm2", miami_ghi,
        ("--entity-col", "station", "--target-col", "ghi", "--known-cols", "etr",
         "--horizon", "24", "--calendar", "hour,doy"),
    ),
    "us_employment": Dataset(
        "vega_datasets", "vega_datasets/_data/us-employment.csv", us_employment,
        ("--entity-col", "series", "--target-col", "value", "--horizon", "6",
         "--history", "24", "--calendar", "time_index"),
    ),
    "co2": Dataset(
        "statsmodels", "statsmodels/datasets/co2/co2.csv", co2,
        ("--target-col", "co2", "--fill-gaps", "--horizon", "13", "--history", "52",
         "--calendar", "doy"),
    ),
}  # fmt: skip


def convert(name: str, out: Path, wheels: Path | None) -> tuple[Path, list[str]]:
    """Write ``out/NAME.csv``; return it and the ``nbqat train`` data arguments."""
    ds = DATASETS[name]
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{name}.csv"
    ds.convert(package_bytes(ds.dist, ds.member, wheels), path)
    return path, ["--csv", str(path), "--time-col", "time", *ds.train_args]


def _run(a: argparse.Namespace, rest: list[str]) -> int:
    from nbqat.cli import main as nbqat_main

    path, args = convert(a.name, a.out, a.wheels)
    seed = rest[rest.index("--seed") + 1] if "--seed" in rest else "0"
    run_dir = a.out / a.name / f"seed{seed}"
    return nbqat_main(["train", *args, "--out", str(run_dir), *rest])


def _weather(a: argparse.Namespace, rest: list[str]) -> int:
    from nbqat.cli import main as nbqat_main

    text = a.file.read_text(encoding="latin-1")
    epw = a.file.suffix.lower() == ".epw"
    station_rows = read_epw(text, a.file.stem) if epw else read_tm2(text)
    a.out.mkdir(parents=True, exist_ok=True)
    csv_path = a.out / f"{a.file.stem}.csv"
    cols = to_csv(*station_rows, csv_path)
    args = ["train", "--csv", str(csv_path), "--time-col", "time", "--target-col", "temp_air"]
    args += ["--entity-col", "station", "--out", str(a.out / "run")]
    if "etr" in cols:
        args += ["--known-cols", "etr"]
    return nbqat_main(args + rest)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    for cmd in ("run", "convert"):
        p = sub.add_parser(cmd)
        p.add_argument("name", choices=[*DATASETS, *(["all"] if cmd == "convert" else [])])
        p.add_argument("--wheels", type=Path, help="folder of downloaded wheels (pip download)")
        p.add_argument("--out", type=Path, default=Path("heldout"))
    p = sub.add_parser("table")
    p.add_argument("out", type=Path)
    p = sub.add_parser("weather")
    p.add_argument("file", type=Path, help="a TMY2 (.tm2) or EnergyPlus (.epw) file")
    p.add_argument("--out", type=Path, default=Path("heldout"))
    argv = sys.argv[1:] if argv is None else argv
    cut = argv.index("--") if "--" in argv else len(argv)
    a, rest = ap.parse_args(argv[:cut]), argv[cut + 1 :]
    if a.cmd == "run":
        return _run(a, rest)
    if a.cmd == "weather":
        return _weather(a, rest)
    if a.cmd == "table":
        print(table(a.out, list(DATASETS)))
        return 0
    for name in DATASETS if a.name == "all" else [a.name]:
        path, args = convert(name, a.out, a.wheels)
        print("nbqat train " + " ".join(args) + f" --out {a.out / name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
