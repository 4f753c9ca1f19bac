"""The window containers: :class:`Windows` (shared per-row feature matrices) and
:class:`SplitWindows` (one split's window indices, gathered lazily into batches)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

__all__ = ["SplitWindows", "Windows"]

#: Which windows of a split: integer indices, a slice, or None for all of them.
Index = np.ndarray | slice | None


@dataclass
class SplitWindows:
    """The windows of one split (train, validation or test).

    A window is an (entity, forecast start) pair; :meth:`batch` gathers its arrays from the
    shared feature matrices of :class:`Windows`, so no window is stored twice.

    Parameters
    ----------
    name : str
        ``"train"``, ``"val"`` or ``"test"``.
    rows : ndarray
        int64 (n,): the global row (into the concatenated series) of each window's first
        forecast step.
    entity : ndarray
        int64 (n,): the entity of each window.
    parent : Windows
        The windows' shared feature matrices.
    """

    name: str
    rows: np.ndarray
    entity: np.ndarray
    parent: Windows = field(repr=False)

    def __len__(self) -> int:
        return len(self.rows)

    def batch(self, idx: Index = None):
        """Model inputs and standardised target of the windows ``idx``.

        Parameters
        ----------
        idx : ndarray of int, slice or None
            Which windows of the split (default: all; a large split then gathers large arrays,
            so training and evaluation pass batches of indices).

        Returns
        -------
        static : ndarray float32 (B, m_s)
        historical : ndarray float32 (B, k, m_z)
            Observed inputs (target first) and known inputs over the k history steps.
        future : ndarray float32 (B, tau, m_x)
            Known inputs over the tau forecast steps.
        target : ndarray float32 (B, tau)
            The standardised target (per-entity level/scale of the training split).

        With ``Scaling.window_norm = "last"`` the history's target column and ``target`` are
        taken relative to each window's :meth:`offset` (:meth:`unscale` adds it back).
        """
        p = self.parent
        rows = self.rows if idx is None else self.rows[idx]
        ent = self.entity if idx is None else self.entity[idx]
        hist_idx = rows[:, None] + np.arange(-p.history, 0)
        fut_idx = rows[:, None] + np.arange(p.horizon)
        hist, target = p.hist_features[hist_idx], p.target_std[fut_idx]
        off = self.offset(idx)
        if off is not None:  # relative to the last history step (Scaling.window_norm)
            hist[..., 0] -= off[:, None]
            target -= off[:, None]
        return p.static[ent], hist, p.future_features[fut_idx], target

    def offset(self, idx: Index = None) -> np.ndarray | None:
        """float32 (B,): what ``Scaling.window_norm = "last"`` subtracts from each window's
        standardised target (its value at the last history step); None without it.

        Parameters
        ----------
        idx : ndarray of int, slice or None
            As in :meth:`batch`.
        """
        sc = self.parent.scaling
        if sc is None or sc.window_norm == "none":
            return None
        rows = self.rows if idx is None else self.rows[idx]
        return self.parent.hist_features[rows - 1, 0]

    def _at(self, column: np.ndarray, steps: np.ndarray, idx: Index) -> np.ndarray:
        """``column`` (one entry per global row) at ``steps`` from each window's first forecast
        row: (B, len(steps))."""
        rows = self.rows if idx is None else self.rows[idx]
        return column[rows[:, None] + steps]

    def target(self, idx: Index = None) -> np.ndarray:
        """float32 (B, tau): the standardised target only (no input arrays gathered), as
        :meth:`batch` returns it (relative to :meth:`offset` where that is set).

        Parameters
        ----------
        idx : ndarray of int, slice or None
            Which windows of the split (default: all), as in :meth:`batch`.
        """
        target = self._at(self.parent.target_std, np.arange(self.parent.horizon), idx)
        off = self.offset(idx)
        return target if off is None else target - off[:, None]

    def scored(self, idx: Index = None) -> np.ndarray | None:
        """bool (B, tau): the forecast steps a metric scores, those with an observed target
        (not repaired by ``fill_gaps``: :attr:`Windows.filled_target`); None when every step
        of the data is observed.

        Parameters
        ----------
        idx : ndarray of int, slice or None
            As in :meth:`target`.
        """
        filled = self.parent.filled_target
        if filled is None:
            return None
        return ~self._at(filled, np.arange(self.parent.horizon), idx)

    def target_raw(self, idx: Index = None) -> np.ndarray:
        """float64 (B, tau): the unscaled target over the forecast steps.

        Parameters
        ----------
        idx : ndarray of int, slice or None
            As in :meth:`target`.
        """
        return self._at(self.parent.target_raw, np.arange(self.parent.horizon), idx)

    def actual(self, idx: Index = None) -> np.ndarray:
        """float64 (B, tau): :meth:`target_raw` with NaN at the steps :meth:`scored` leaves
        out (``fill_gaps``' repairs: no observation to compare a forecast with).

        Parameters
        ----------
        idx : ndarray of int, slice or None
            As in :meth:`target`.
        """
        y, keep = self.target_raw(idx), self.scored(idx)
        return y if keep is None else np.where(keep, y, np.nan)

    def history_raw(self, idx: Index = None) -> np.ndarray:
        """float64 (B, k): the unscaled target over the history steps.

        Parameters
        ----------
        idx : ndarray of int, slice or None
            Windows of the split; all of them when None.
        """
        return self._at(self.parent.target_raw, np.arange(-self.parent.history, 0), idx)

    def unscale(self, pred: np.ndarray, idx: Index = None) -> np.ndarray:
        """Undo the per-entity standardisation of predictions (B, tau[, Q]) -> float64.

        Parameters
        ----------
        pred : ndarray (B, tau) or (B, tau, Q)
            Standardised values (model outputs); with ``Scaling.window_norm = "last"``
            relative to each window's :meth:`offset`, which is added back first (in ``pred``'s
            dtype).
        idx : ndarray of int, slice or None
            The windows ``pred`` belongs to (default: all of the split, in order).
        """
        ent = self.entity if idx is None else self.entity[idx]
        lvl = self.parent.level[ent].reshape((-1,) + (1,) * (pred.ndim - 1))
        scl = self.parent.scale[ent].reshape((-1,) + (1,) * (pred.ndim - 1))
        off = self.offset(idx)
        if off is not None:  # added back in pred's dtype (float32 for model outputs)
            pred = np.asarray(pred) + off.reshape((-1,) + (1,) * (pred.ndim - 1))
        return pred.astype(np.float64) * scl + lvl

    def seasonal_naive(self, idx: Index = None) -> np.ndarray:
        """float64 (B, tau): the seasonal-naive point forecast, ``y[t - season]``.

        For forecast step h (0-based) it is the target ``season * ceil((h + 1) / season)``
        steps earlier, i.e. the last observed season repeated; with hourly data, season 24 and
        tau 24 it is the value 24 hours earlier.

        Parameters
        ----------
        idx : ndarray of int, slice or None
            Which windows of the split (default: all).
        """
        p = self.parent
        h = np.arange(p.horizon)
        return self._at(p.target_raw, h - p.season * ((h // p.season) + 1), idx)

    def times(self, idx: Index = None) -> np.ndarray:
        """The time stamps (B, tau) of the forecast steps.

        Parameters
        ----------
        idx : ndarray of int, slice or None
            The windows (None: the whole split).
        """
        return self._at(self.parent.time, np.arange(self.parent.horizon), idx)


@dataclass
class Windows:
    """TFT windows over :class:`SeriesData` (the output of :func:`make_windows`).

    The series of all entities are concatenated row-wise into shared feature matrices;
    the splits hold only row indices (see :class:`SplitWindows`).

    Parameters
    ----------
    history, horizon, season : int
        k (encoder steps), tau (forecast steps), seasonal-naive period (steps).
    quantiles : tuple of float
    static : ndarray float32 (n_entities, m_s)
    hist_features : ndarray float32 (n_rows, m_z)
    future_features : ndarray float32 (n_rows, m_x)
    target_std : ndarray float32 (n_rows,)
    target_raw : ndarray float64 (n_rows,)
    time : ndarray (n_rows,)
    level, scale : ndarray float64 (n_entities,)
        Per-entity mean and standard deviation of the target on the training rows.
    entity_names, static_names, historical_names, future_names : list of str
    naive_residual_quantiles : ndarray float64 (n_entities, Q)
        Empirical quantiles of the seasonal-naive residual ``y[t] - y[t - season]`` on the
        training rows of each entity (see :func:`seasonal_naive_quantiles`; the baseline's
        steps further back than a season use their own lag's,
        :func:`nbqat.train.baselines.seasonal_naive_forecast`).
    cutoffs : tuple
        The first time of the validation split and of the test split.
    target_name, source : str
        The target column and where the data came from.
    filled : dict
        ``SeriesData.filled``: the cells ``fill_gaps`` repaired per entity and column.
    step : numpy.timedelta64 or float
        The time step.
    train_stride, eval_stride : int
        Steps between consecutive windows of the training / evaluation splits.
    scaling : nbqat.data.Scaling, optional
        The input transform the feature matrices were built with (fitted on the training
        rows); ``nbqat predict`` applies the run's to new rows.
    carried : dict
        ``SeriesData.carried``: the flag / level columns ``fill_gaps`` repaired by carrying
        the last value (not interpolating), per entity.
    split_bounds : dict of str to ndarray
        ``{"train" | "val" | "test": int64 (n_entities, 2)}``: the global rows ``[first, end)``
        of each entity's part of each split (set by :func:`make_windows`; empty for the
        forecast windows of ``nbqat predict``); :meth:`make_split` cuts the windows from them.
    filled_target : ndarray or None
        bool (n_rows,): True at the rows whose target ``fill_gaps`` repaired
        (``SeriesData.filled_target``), inputs only: :meth:`SplitWindows.scored` leaves them
        out of every metric; None when no target value was repaired.

    Attributes
    ----------
    train, val, test : SplitWindows
        The splits (set by :func:`make_windows`).
    Notes
    -----
    Inputs of a window:

    * static (per entity): entity id (scaled to [-1, 1]), the user's static columns, the
      target's training level and scale; each standardised across entities (z-score; a column
      constant across entities becomes 0).
    * historical (k steps): the standardised target, the standardised observed inputs, then
      the known inputs below (the encoder also sees the past values of known inputs).
    * future (tau steps): the known inputs: for date times hour of day (sin, cos; only for
      sub-daily steps), day of year (sin, cos), day of week (scaled to [-1, 1]); always the time
      index (scaled so the training range maps to [-1, 1]) and the user's known columns
      (standardised per entity on training rows).

    A column with zero spread on the training rows (Sand Point's constant pressure) gets scale
    1 (it is centred only).
    """

    history: int
    horizon: int
    season: int
    quantiles: tuple[float, ...]
    static: np.ndarray
    hist_features: np.ndarray
    future_features: np.ndarray
    target_std: np.ndarray
    target_raw: np.ndarray
    time: np.ndarray
    level: np.ndarray
    scale: np.ndarray
    entity_names: list[str]
    static_names: list[str]
    historical_names: list[str]
    future_names: list[str]
    naive_residual_quantiles: np.ndarray
    cutoffs: tuple
    target_name: str
    source: str
    filled: dict = field(default_factory=dict)
    step: object = None
    train_stride: int = 1
    eval_stride: int = 1
    scaling: Any = None
    carried: dict = field(default_factory=dict)
    split_bounds: dict = field(default_factory=dict)
    filled_target: np.ndarray | None = None
    train: SplitWindows = field(init=False, repr=False)
    val: SplitWindows = field(init=False, repr=False)
    test: SplitWindows = field(init=False, repr=False)

    def summary(self) -> dict:
        """A JSON-friendly description (sizes, names, cutoffs)."""
        return {
            "source": self.source,
            "target": self.target_name,
            "entities": self.entity_names,
            "history": self.history,
            "horizon": self.horizon,
            "season": self.season,
            "train_stride": self.train_stride,
            "eval_stride": self.eval_stride,
            "static_inputs": self.static_names,
            "historical_inputs": self.historical_names,
            "future_inputs": self.future_names,
            "windows": {"train": len(self.train), "val": len(self.val), "test": len(self.test)},
            "val_start": str(self.cutoffs[0]),
            "test_start": str(self.cutoffs[1]),
            "step": str(self.step),
            "filled": self.filled,
            **({"carried_not_interpolated": self.carried} if self.carried else {}),
        }

    def make_split(self, name: str) -> SplitWindows:
        """The windows of split ``name``: every forecast start at ``eval_stride`` from the
        split's first row (``train_stride`` from ``history`` rows into the entity for
        ``"train"``) that has ``history`` earlier rows in its entity (the grid is not moved: the
        rolling origins of ``nbqat backtest`` from the test split's start are these), to the
        last start whose ``horizon`` steps all lie in the split.

        The one rule that cuts the windows (:func:`make_windows` and :meth:`with_history`).

        Parameters
        ----------
        name : {"train", "val", "test"}

        Returns
        -------
        SplitWindows
            Possibly empty (the caller decides whether that is an error).

        Raises
        ------
        ValueError
            For another name, or windows without :attr:`split_bounds`.
        """
        if name not in ("train", "val", "test"):
            raise ValueError(f"split name must be 'train', 'val' or 'test', got {name!r}")
        if not self.split_bounds:
            raise ValueError("these windows have no split bounds (only make_windows sets them)")
        stride = self.train_stride if name == "train" else self.eval_stride
        first = self.split_bounds["train"][:, 0]  # each entity's first global row
        rows, ent = [], []
        for e, (lo, hi) in enumerate(self.split_bounds[name]):
            grid = first[e] + self.history if name == "train" else lo  # the first start's row
            start = grid + max(0, -(-(first[e] + self.history - grid) // stride)) * stride
            starts = np.arange(start, hi - self.horizon + 1, stride)
            rows.append(starts.astype(np.int64))
            ent.append(np.full(len(starts), e, dtype=np.int64))
        return SplitWindows(name, np.concatenate(rows), np.concatenate(ent), self)

    def with_history(self, history: int) -> Windows:
        """These windows with another history length ``k`` (e.g. for a baseline).

        The feature matrices, scaling, season, horizon and strides are shared (not copied);
        every split is cut again by :meth:`make_split`, so a longer history drops the forecast
        starts with fewer than ``history`` earlier rows in their entity (in practice the first
        training windows: the validation and test starts lie far into the series) and a shorter
        one may add training windows.

        Parameters
        ----------
        history : int
            ``>= season`` (the seasonal-naive forecast reads the history).

        Returns
        -------
        Windows
            Its splits may be empty; compare their ``rows`` with these windows' to check that
            the forecast starts are the same.

        Raises
        ------
        ValueError
            For a history that is not an integer in ``[season, n_rows)``, or windows without
            :attr:`split_bounds`.
        """
        n_rows = len(self.target_std)
        if (
            isinstance(history, bool)
            or not isinstance(history, (int, np.integer))
            or not (self.season <= history < n_rows)
        ):
            raise ValueError(
                f"history must be an integer in [season={self.season}, {n_rows}), got {history!r}"
            )
        w = replace(self, history=int(history))
        for name in ("train", "val", "test"):
            setattr(w, name, w.make_split(name))
        return w
