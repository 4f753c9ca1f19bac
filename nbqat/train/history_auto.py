"""``--history auto``: the model's history length chosen on the validation split.

The choice reuses the tuned ridge's search (:func:`nbqat.train.baselines.tune_ridge`): every
history the data allows (whole seasons and the default history) is scored by the ridge's best
validation P50 q-risk over its penalties, and the lowest score among the histories whose
window (``history + horizon`` steps) fits :data:`MAX_WINDOW_STEPS` wins (the shortest on a
tie). The cap keeps the run inside the default run's time budget: the TFT's cost per window
grows with its length, and the shipped default run (48 steps, about 52 s on 2 cores) may
grow about fivefold within the 5 minutes. Nothing of the test split is read.
"""

from __future__ import annotations

from typing import Any

#: The longest window (history + horizon, steps) ``--history auto`` may choose.
MAX_WINDOW_STEPS = 240


def choose_history(w: Any, max_window: int = MAX_WINDOW_STEPS) -> tuple[int, dict]:
    """The history ``--history auto`` picks for the windows ``w``, and its record.

    Parameters
    ----------
    w : nbqat.data.Windows
        The windows cut with the default history (``w.history``).
    max_window : int, default MAX_WINDOW_STEPS
        The cap on ``history + w.horizon`` (steps, >= 1). The default history is always a
        candidate, even beyond the cap.

    Returns
    -------
    history : int
        The chosen history (steps).
    record : dict
        ``option`` ("auto"), ``history``, ``default_history``, ``criterion``, ``max_window``,
        ``ridge_history`` (the ridge's own choice, uncapped), ``scores`` (each candidate
        history's best validation score, as ``{"history", "score"}`` rows, ascending) and
        ``capped`` (the candidates left out by the cap).

    Raises
    ------
    ValueError
        For a ``max_window`` that is not a positive integer, or what
        :func:`~nbqat.train.baselines.tune_ridge` raises.
    """
    from nbqat.train.baselines import tune_ridge

    if isinstance(max_window, bool) or not isinstance(max_window, int) or max_window < 1:
        raise ValueError(f"max_window must be a positive integer, got {max_window!r}")
    tuned = tune_ridge(w)
    crit = tuned.criterion
    best: dict[int, float] = {}
    for g in tuned.grid:
        h = int(g["history"])
        best[h] = min(best.get(h, float("inf")), float(g[crit]))
    default = int(w.history)
    ok = {h: s for h, s in best.items() if h + w.horizon <= max_window or h == default}
    chosen = min(sorted(ok), key=lambda h: ok[h])  # sorted + min: the shortest on a tie
    record = {
        "option": "auto",
        "history": chosen,
        "default_history": default,
        "criterion": crit,
        "max_window": max_window,
        "ridge_history": int(tuned.history),
        "scores": [{"history": h, "score": best[h]} for h in sorted(best)],
        "capped": sorted(h for h in best if h not in ok),
    }
    return chosen, record


__all__ = ["MAX_WINDOW_STEPS", "choose_history"]
