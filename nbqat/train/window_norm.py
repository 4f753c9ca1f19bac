"""``--window-norm``: each window's target relative to its last history value (issue 31).

With ``"last"`` the model reads the standardised target's history minus its value at the
window's last history step and predicts the forecast steps minus that value, which is added back
to its forecasts: NLinear's normalisation (Zeng et al., "Are Transformers Effective for Time
Series Forecasting?", AAAI 2023; RevIN, Kim et al., ICLR 2022, also rescales). A level that
drifts beyond the training range then reaches the network as the recent change only. The
arithmetic is :class:`nbqat.data.SplitWindows`' (``batch`` / ``target`` / ``unscale``, from
``Scaling.window_norm``), and the self-contained ONNX graph repeats it; the baselines read the
same windows, so the tuned ridge is fitted on the normalised windows too.

``"auto"`` (the default) takes ``"last"`` exactly where the validation split's standardised
targets leave the training split's range (:func:`drift_bounds`): a drifting level. Decided from the
training and validation splits only, before any training; a resumed run decides again with the
same result.
"""

from __future__ import annotations

from typing import Any

from nbqat.train.options import WINDOW_NORMS

__all__ = ["choose_window_norm", "drift_bounds"]


def drift_bounds(w: Any) -> dict:
    """The drift test: where the validation split's targets leave the training split's range,
    and the range one more split of that drift would reach.

    Parameters
    ----------
    w : nbqat.data.Windows
        The run's windows (``w.train`` and ``w.val`` are read, never ``w.test``).

    Returns
    -------
    dict
        ``train`` and ``val``: ``[min, max]`` of the split's standardised forecast targets
        (float); ``bounds``: ``[lo, hi]`` to cover, ``lo = v_min - (t_min - v_min)`` where
        ``v_min < t_min`` else None, ``hi = v_max + (v_max - t_max)`` where ``v_max > t_max``
        else None.
    """
    t, v = w.train.target(), w.val.target()
    tl, th, vl, vh = (float(x) for x in (t.min(), t.max(), v.min(), v.max()))
    lo = vl - (tl - vl) if vl < tl else None
    hi = vh + (vh - th) if vh > th else None
    return {"train": [tl, th], "val": [vl, vh], "bounds": [lo, hi]}


def choose_window_norm(option: str, w: Any) -> dict:
    """Resolve ``--window-norm`` on the windows ``w`` and set ``w.scaling.window_norm``.

    Parameters
    ----------
    option : {"auto", "none", "last"}
    w : nbqat.data.Windows
        The run's windows, not yet normalised (their ``scaling.window_norm`` is ``"none"``).

    Returns
    -------
    dict
        ``option``, ``choice`` (``"none"`` or ``"last"``) and, for ``"auto"``, the rule's
        evidence: the ``train`` and ``val`` ranges of the standardised targets.

    Raises
    ------
    ValueError
        For another ``option``, or windows without a :class:`~nbqat.data.Scaling`.
    """
    if option not in WINDOW_NORMS:
        raise ValueError(f"--window-norm must be one of {WINDOW_NORMS}, got {option!r}")
    if w.scaling is None or w.scaling.window_norm != "none":
        raise ValueError("choose_window_norm: the windows must carry a Scaling, not normalised")
    rec: dict = {"option": option}
    choice = option
    if option == "auto":
        b = drift_bounds(w)
        choice = "none" if b["bounds"] == [None, None] else "last"
        rec["rule"] = "last where the validation targets leave the training targets' range"
        rec["train"], rec["val"] = b["train"], b["val"]
    rec["choice"] = choice
    w.scaling.window_norm = choice
    return rec
