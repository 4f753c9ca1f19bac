"""The shipped dataset: one year of hourly NREL TMY3 weather at two US stations."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from nbqat.data._reader import load_csv
from nbqat.data._series import SeriesData

__all__ = ["TMY3_COLUMNS", "TMY3_FILE", "TMY3_UNITS", "load_tmy3", "tmy3_path"]

#: File name of the shipped dataset inside the package.
TMY3_FILE = "tmy3_two_stations.csv.gz"

#: How :func:`load_tmy3` reads the shipped file.
TMY3_COLUMNS = {
    "time_col": "time",
    "target_col": "temp_air",
    "entity_col": "station",
    "known_cols": ("etr",),
    "static_cols": ("latitude", "longitude", "elevation"),
    "observed_cols": (
        "temp_dew",
        "relative_humidity",
        "pressure",
        "wind_speed",
        "total_cloud",
        "ghi",
    ),
}

#: Units of the shipped columns (``nbqat/data/README.md``), used for plot labels.
TMY3_UNITS = {
    "temp_air": "deg C",
    "temp_dew": "deg C",
    "relative_humidity": "%",
    "pressure": "mbar",
    "wind_speed": "m/s",
    "total_cloud": "tenths",
    "ghi": "W/m^2",
    "etr": "W/m^2",
}


def tmy3_path() -> Path:
    """Path of the shipped dataset file (inside the installed package)."""
    return Path(str(resources.files("nbqat.data").joinpath(TMY3_FILE)))


def load_tmy3() -> SeriesData:
    """The shipped dataset: hourly NREL TMY3 weather at Sand Point AK and Greensboro NC.

    Target ``temp_air`` (dry-bulb temperature, deg C); observed inputs dew point, relative
    humidity, pressure, wind speed, total cloud cover and GHI; known input ETR (extraterrestrial
    radiation, astronomical); static inputs latitude, longitude, elevation. 8,760 hours per
    station in a nominal year 2001 (see ``nbqat/data/README.md``).

    Returns
    -------
    SeriesData
    """
    data = load_csv(tmy3_path(), **TMY3_COLUMNS)  # type: ignore[arg-type]
    data.source = f"nbqat/data/{TMY3_FILE} (NREL TMY3, public domain; via pvlib-python)"
    return data
