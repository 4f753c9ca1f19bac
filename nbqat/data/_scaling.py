"""The input transform of a run (:class:`Scaling`): per-entity standardisation, static
features and calendar encodings, fitted once on the training split and applied to any rows.

:func:`nbqat.data.make_windows` fits it (:func:`fit_scaling`) and builds its feature matrices
with :meth:`Scaling.observed_features` / :meth:`Scaling.known_features`; ``nbqat predict``
applies the run's stored one (``model.onnx``'s ``nbqat`` metadata) to new rows through the
same two methods, so the two never drift apart. The self-contained ONNX graph
(:mod:`nbqat.export.preprocess`) computes the same formulas.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from nbqat.data._calendar import _CAL_GROUP, axis_step, calendar_features
from nbqat.data._months import is_month_axis
from nbqat.data._series import SeriesData

__all__ = ["Scaling", "fit_scaling", "zscore_fit"]


def zscore_fit(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Column means and standard deviations of ``x`` (N, m); a spread below ``1e-12`` of the
    mean's magnitude gets scale 1 (the column is centred only). NaN cells (an observed
    column before its first value, ``fill_gaps``) are left out."""
    nan = bool(np.isnan(x).any())
    mu = np.nanmean(x, axis=0) if nan else x.mean(axis=0)
    sd = np.nanstd(x, axis=0) if nan else x.std(axis=0)
    sd = np.where(sd > 1e-12 * np.maximum(1.0, np.abs(mu)), sd, 1.0)
    return mu, sd


@dataclass
class Scaling:
    """A run's input transform (everything needed to turn raw rows into model inputs).

    Parameters
    ----------
    entities : list of str
        The training run's entities, in order (index ``e`` below).
    target, observed, known, static_columns : str, list of str
        The raw column names of each role.
    level, scale : list of float (E,)
        The target's training mean and standard deviation per entity (``pred * scale +
        level`` gives the target's units).
    obs_mu, obs_sd : list of list of float (E, 1 + m_obs)
        Standardisation of the target and the observed columns per entity.
    known_mu, known_sd : list of list of float (E, m_known)
        Standardisation of the user's known columns per entity.
    static : list of list of float (E, m_s)
        The static input of each entity (entity id, static columns, target level and scale,
        standardised across entities).
    calendar : list of str
        The ``--calendar`` groups (hour, doy, dow, time_index).
    calendar_names : list of str
        The calendar features kept (``hour_sin`` ...), in input order.
    is_datetime : bool
        Whether times are date times (seconds since the epoch, UTC) or plain numbers.
    t0, t_span : float
        ``time_index = 2 (t - t0) / t_span - 1`` (seconds for date times, months on a
        calendar-month axis).
    step : float
        The time step (seconds for date times, months on a calendar-month axis).
    window_norm : {"none", "last"}, default "none"
        ``"last"``: each window's standardised target is taken relative to its value at the
        window's last history step (NLinear's normalisation, Zeng et al., "Are Transformers
        Effective for Time Series Forecasting?", AAAI 2023): the model reads the history and
        predicts the forecast steps minus that value, which is added back to its forecasts
        (:meth:`SplitWindows.batch`, :meth:`SplitWindows.unscale`; the ONNX graph does the
        same). Set by the main job's ``--window-norm``.
    month_day : int, default 0
        ``SeriesData.month_day`` of the training data: non-zero for a calendar-month axis
        (monthly, quarterly, yearly dates; times are then months since 1970-01).
    """

    entities: list[str]
    target: str
    observed: list[str]
    known: list[str]
    static_columns: list[str]
    level: list[float]
    scale: list[float]
    obs_mu: list[list[float]]
    obs_sd: list[list[float]]
    known_mu: list[list[float]]
    known_sd: list[list[float]]
    static: list[list[float]]
    calendar: list[str]
    calendar_names: list[str]
    is_datetime: bool
    t0: float
    t_span: float
    step: float
    window_norm: str = "none"
    month_day: int = 0

    def to_json(self) -> dict:
        """A JSON-able dict (floats round-trip exactly); :meth:`from_json` reads it back."""
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict) -> Scaling:
        """The :class:`Scaling` of :meth:`to_json`'s dict.

        Parameters
        ----------
        d : dict
            :meth:`to_json`'s output (extra keys are ignored; a field with a default may be
            missing: a run written before it existed).
        """
        return cls(**{k: d[k] for k in cls.__dataclass_fields__ if k in d})

    def index(self, name: str) -> int:
        """The index of entity ``name``.

        Parameters
        ----------
        name : str

        Raises
        ------
        ValueError
            For an entity the run does not know (the message names the run's entities).
        """
        try:
            return self.entities.index(str(name))
        except ValueError:
            raise ValueError(
                f"entity {name!r} is not one of the training run's entities {self.entities}: "
                "the model has static features and a standardisation for those only; leave "
                f"{name!r}'s rows out of the data to forecast the others, or fit a model on "
                f"data that holds {name!r}"
            ) from None

    def seconds(self, t: np.ndarray) -> np.ndarray:
        """Times as float64 numbers on the stored axis (seconds since the epoch for date
        times, months since 1970-01 on a calendar-month axis).

        Parameters
        ----------
        t : ndarray (n,)
            ``datetime64`` or numbers.
        """
        if is_month_axis(t):
            return t.astype(np.int64).astype(np.float64)
        if self.is_datetime:
            return t.astype("datetime64[s]").astype(np.int64).astype(np.float64)
        return np.asarray(t, dtype=np.float64)

    def observed_features(self, e: int, obs: np.ndarray) -> np.ndarray:
        """float64 (n, 1 + m_obs): the standardised target and observed columns.

        Parameters
        ----------
        e : int
            The entity's index.
        obs : ndarray float64 (n, 1 + m_obs)
            The raw target and observed columns.
        """
        return (obs - np.asarray(self.obs_mu[e])) / np.asarray(self.obs_sd[e])

    def observed_or_mean(self, e: int, observed: np.ndarray) -> np.ndarray:
        """float64 (n, m_obs): the raw observed columns with each NaN (before the column's
        first value, ``fill_gaps``: nothing earlier is known) replaced by the column's
        training mean, which :meth:`observed_features` turns into 0.

        Parameters
        ----------
        e : int
            The entity's index.
        observed : ndarray float64 (n, m_obs)
        """
        missing = np.isnan(observed)
        if not missing.any():
            return observed
        return np.where(missing, np.asarray(self.obs_mu[e][1:]), observed)

    def known_features(self, e: int, t: np.ndarray, known: np.ndarray) -> np.ndarray:
        """float64 (n, m_x): calendar features, time index, standardised known columns (in
        :attr:`future_names` order).

        Parameters
        ----------
        e : int
            The entity's index.
        t : ndarray (n,)
            The times (``datetime64[s]`` or numbers).
        known : ndarray float64 (n, m_known)
            The raw known columns.
        """
        parts = []
        if self.calendar_names:
            cal, names = calendar_features(t)
            parts.append(cal[:, [names.index(c) for c in self.calendar_names]])
        if "time_index" in self.calendar:
            tnum = self.seconds(t) - self.t0
            parts.append((2.0 * tnum / max(float(self.t_span), 1e-300) - 1.0)[:, None])
        if self.known:
            parts.append((known - np.asarray(self.known_mu[e])) / np.asarray(self.known_sd[e]))
        if not parts:
            return np.zeros((len(t), 0))
        return np.concatenate(parts, axis=1)

    @property
    def future_names(self) -> list[str]:
        """The names of the known inputs (decoder inputs)."""
        ti = ["time_index"] if "time_index" in self.calendar else []
        return list(self.calendar_names) + ti + list(self.known)


def constant_calendar(data: SeriesData) -> set[str]:
    """The ``--calendar`` groups that cannot vary on the data's time axis, left out of the
    features: ``hour`` at a step of a day or more, ``dow`` too at a whole number of weeks
    (weekly data: a constant input that told the decoder's steps nothing); on a calendar-month
    axis ``hour`` and ``dow`` (it has only its month of year), and ``doy`` too at a whole number
    of years (yearly dates: every step in the same month)."""
    if not data.is_datetime:
        return set()
    step_s = axis_step(data)  # in months on a calendar-month axis
    if data.month_day:
        return {"hour", "dow"} | ({"doy"} if step_s % 12 == 0 else set())
    dropped = {"hour"} if step_s >= 86400 else set()
    if step_s % (7 * 86400) == 0:
        dropped.add("dow")
    return dropped


def _calendar_names(data: SeriesData, calendar: tuple) -> list[str]:
    if not data.is_datetime:
        return []
    dropped = constant_calendar(data)
    _, names = calendar_features(data.times[0][:1])
    return [c for c in names if _CAL_GROUP[c] in calendar and _CAL_GROUP[c] not in dropped]


def _static(data: SeriesData, level: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """Entity id, the user's static columns, target level and scale; z-scored across
    entities (a column constant across entities becomes 0)."""
    n_ent = len(data.entity_names)
    cols = [np.linspace(-1.0, 1.0, n_ent) if n_ent > 1 else np.zeros(1)]
    cols += [data.static[:, j] for j in range(len(data.static_names))]
    s = np.stack([*cols, level, scale], axis=1)
    mu_s, sd_s = s.mean(axis=0), s.std(axis=0)
    return np.where(sd_s > 0, (s - mu_s) / np.where(sd_s > 0, sd_s, 1.0), 0.0)


def fit_scaling(data: SeriesData, train_ends: list[int], cuts: tuple, calendar: tuple) -> Scaling:
    """Fit the transform on each entity's training rows ``[:train_ends[e]]``.

    Parameters
    ----------
    data : SeriesData
    train_ends : list of int
        Per entity, the end row of its training split.
    cuts : tuple
        ``(t0, cut_val, cut_test)`` of :func:`nbqat.data._windows._cut_points`.
    calendar : tuple of str
        The calendar groups.

    Returns
    -------
    Scaling
    """
    t0, cut_val = cuts[0], cuts[1]
    if data.month_day:  # calendar months: months since 1970-01
        t0_n, span = float(t0.astype(np.int64)), float((cut_val - t0).astype(np.int64))
    elif data.is_datetime:
        t0_n = float(np.datetime64(t0, "s").astype(np.int64))
        span = float((cut_val - t0) / np.timedelta64(1, "s"))
    else:
        t0_n, span = float(t0), float(cut_val - t0)
    lv, sc, om, osd, km, ksd = [], [], [], [], [], []
    for e, i_val in enumerate(train_ends):
        a, b = zscore_fit(data.target[e][:i_val, None])
        lv.append(float(a[0]))
        sc.append(float(b[0]))
        obs = np.concatenate([data.target[e][:i_val, None], data.observed[e][:i_val]], axis=1)
        mu, sd = zscore_fit(obs)
        om.append(mu.tolist())
        osd.append(sd.tolist())
        if data.known[e].shape[1]:
            mu_k, sd_k = zscore_fit(data.known[e][:i_val])
        else:
            mu_k = sd_k = np.zeros(0)
        km.append(mu_k.tolist())
        ksd.append(sd_k.tolist())
    static = _static(data, np.array(lv), np.array(sc))
    return Scaling(
        entities=list(data.entity_names), target=data.target_name,
        observed=list(data.observed_names), known=list(data.known_names),
        static_columns=list(data.static_names), level=lv, scale=sc, obs_mu=om, obs_sd=osd,
        known_mu=km, known_sd=ksd, static=static.tolist(), calendar=list(calendar),
        calendar_names=_calendar_names(data, calendar), is_datetime=data.is_datetime,
        t0=t0_n, t_span=span, step=axis_step(data), month_day=int(data.month_day),
    )  # fmt: skip


def entity_features(sc: Scaling, e: int, t: Any, target: Any, observed: Any, known: Any):
    """``(historical rows (n, m_z), future rows (n, m_x), standardised target (n,))`` float64
    of entity ``e`` (its index in ``sc``) from raw rows."""
    obs = np.concatenate([np.asarray(target)[:, None], sc.observed_or_mean(e, observed)], axis=1)
    kn = sc.known_features(e, t, known)
    ystd = (np.asarray(target) - sc.level[e]) / sc.scale[e]
    return np.concatenate([sc.observed_features(e, obs), kn], axis=1), kn, ystd
