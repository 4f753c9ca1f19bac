"""The loaded-data container (:class:`SeriesData`), :class:`DataError` and the shared limits."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

__all__ = ["DataError", "MAX_ABS_VALUE", "MAX_FILL_FRACTION", "SeriesData"]

#: Largest magnitude accepted in a numeric input column. The network computes in float32
#: (largest finite value about 3.4e38) and the statistics square the values in float64, so a
#: value beyond this bound would overflow to ``inf`` or zero a column's standardisation.
MAX_ABS_VALUE = 1e30

#: Largest fraction of one entity's rows that ``fill_gaps=True`` may repair in one column
#: (inserted time steps or missing cells). Beyond it the data is refused: an interpolated series
#: is then mostly invented.
MAX_FILL_FRACTION = 0.2


class DataError(ValueError):
    """A problem with the input data (a subclass of ValueError, with a message saying the fix)."""


@dataclass
class SeriesData:
    """Regular, gap-free time series of several entities (the output of :func:`load_csv`).

    Parameters
    ----------
    entity_names : list of str
        One name per entity, in order of first appearance in the file.
    times : list of ndarray
        Per entity, the time axis: ``datetime64[s]`` when the time column holds ISO 8601 date
        times (time-zone-aware values converted to UTC), ``datetime64[M]`` for monthly,
        quarterly or yearly dates (a calendar-month axis, see ``month_day``), float64 when it
        holds numbers. Strictly increasing with a constant step.
    step : numpy.timedelta64 or float
        The time step shared by all entities (``timedelta64[M]`` on a calendar-month axis).
    target : list of ndarray
        Per entity, float64 (N_e,): the target values (unscaled).
    observed : list of ndarray
        Per entity, float64 (N_e, m_obs): the other observed (past-only) inputs; NaN before
        a column's first value with ``fill_gaps`` (read as its training mean).
    known : list of ndarray
        Per entity, float64 (N_e, m_known): the user's known-in-advance inputs.
    static : ndarray
        float64 (n_entities, m_static): the static values of each entity.
    target_name, observed_names, known_names, static_names
        Column names.
    n_filled : int
        Cells repaired by ``fill_gaps=True``; 0 otherwise.
    source : str
        Where the data came from (a path or the shipped file's name).
    filled : dict
        ``{entity: {column: count}}``: the cells repaired per entity and column (only the
        non-zero counts; empty without repairs).
    time_format : str
        How the time column spells its values (a :meth:`datetime.strftime` format such as
        ``%Y-%m-%dT%H:%M``, ``"number"`` or ``"integer"``): forecasts are written that way.
    carried : dict
        ``{entity: [column, ...]}``: the columns of a few whole-number levels (flags,
        categories) that ``fill_gaps`` repaired by carrying the last value instead of
        interpolating.
    month_day : int
        0, except on a calendar-month axis: the day of month its dates fall on (1 to 28), or
        -1 for the last day of the month (:func:`nbqat.data._months.month_dates` spells the
        months back as those dates).
    filled_target : list of ndarray
        Per entity, bool (N_e,): True at the steps whose target ``fill_gaps`` repaired (a
        missing step or cell), which are inputs only: no validation, test or backtest metric
        scores them. Empty (no entity) when no target value was repaired.
    """

    entity_names: list[str]
    times: list[np.ndarray]
    step: Any
    target: list[np.ndarray]
    observed: list[np.ndarray]
    known: list[np.ndarray]
    static: np.ndarray
    target_name: str
    observed_names: list[str]
    known_names: list[str]
    static_names: list[str]
    n_filled: int = 0
    source: str = ""
    filled: dict = field(default_factory=dict)
    time_format: str = "%Y-%m-%dT%H:%M:%S"
    carried: dict = field(default_factory=dict)
    month_day: int = 0
    filled_target: list = field(default_factory=list)

    @property
    def is_datetime(self) -> bool:
        """Whether the time axis holds date times (then calendar features are derived)."""
        return self.times[0].dtype.kind == "M"

    @property
    def lengths(self) -> list[int]:
        """Number of time steps of each entity."""
        return [len(t) for t in self.times]


def _names(cols: Sequence[str] | str | None) -> list[str]:
    if cols is None:
        return []
    if isinstance(cols, str):
        return [c.strip() for c in cols.split(",") if c.strip()]
    return [str(c) for c in cols]
