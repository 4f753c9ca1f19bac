"""PNG plots of a training run (matplotlib, Agg canvas; pyplot and the global backend untouched).

Every function takes plain NumPy arrays / lists, writes one PNG and returns its path, so the
plots can be tested with synthetic arrays and reused on any run's results.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

__all__ = [
    "step_unit",
    "target_label",
    "plot_attention",
    "plot_clipping_comparison",
    "plot_forecast_fan",
    "plot_loss_curves",
    "plot_quantizers",
    "plot_variable_importance",
]


def _figure(w: float, h: float):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(w, h), dpi=100)
    FigureCanvasAgg(fig)
    return fig


def _esc(text: object) -> str:
    """A user-given name as literal text: ``$`` would start matplotlib mathtext."""
    return str(text).replace("$", r"\$")


def step_unit(step: object) -> str:
    """Axis unit of a time step: ``"hours"`` for 1 h, ``"days"``, ``"weeks"``, ``"minutes"``,
    else steps (``"steps of 30 minutes"``, ``"steps of 3 months"``).

    Parameters
    ----------
    step : numpy.timedelta64 or float
        ``SeriesData.step`` / ``Windows.step``.

    Returns
    -------
    str
    """
    if isinstance(step, np.timedelta64) and step.dtype == np.dtype("timedelta64[M]"):
        return "months" if int(step.astype(np.int64)) == 1 else f"steps of {step}"
    if isinstance(step, np.timedelta64):
        secs = step / np.timedelta64(1, "s")
        units = ((604800, "weeks"), (86400, "days"), (3600, "hours"), (60, "minutes"),
                 (1, "seconds"))  # fmt: skip
        for n, name in units:
            if secs == n:
                return name
        n, name = next(((n, name) for n, name in units if secs % n == 0), (1, "seconds"))
        return f"steps of {secs / n:g} {name}"  # 30 minutes, not 1800 seconds
    return "steps"


def target_label(name: str, source: str = "") -> str:
    """The target's axis label, ``name (unit)`` where the unit is known (the shipped data).

    Parameters
    ----------
    name : str
        The target column.
    source : str
        ``Windows.source`` (the shipped file's name selects its units).

    Returns
    -------
    str
    """
    from nbqat.data import TMY3_FILE, TMY3_UNITS

    if TMY3_FILE in source and name in TMY3_UNITS:
        return f"{name} ({TMY3_UNITS[name]})"
    return name


def _save(fig, path: str | Path) -> Path:
    path = Path(path)
    fig.tight_layout()
    fig.savefig(path, format="png")
    return path


def plot_loss_curves(
    curves: Mapping[str, Mapping[str, Sequence[float]]],
    path: str | Path,
    events: Mapping[str, Mapping[str, int]] | None = None,
) -> Path:
    """Loss curves, one panel per phase.

    Parameters
    ----------
    curves : mapping phase -> mapping series -> sequence of float
        E.g. ``{"float": {"train": [...], "val": [...]}, "qat": {...}}``; each series is
        plotted against its epoch. The QAT phases (``qat``, ``qat_noclip``) continue the float
        phase's epoch count (QAT epoch 1 is drawn at float epochs + 1). A series named
        ``start_<name>`` holds one value, drawn at epoch 0 (before training).
    path : str or Path
        Output PNG.
    events : mapping phase -> mapping label -> epoch, optional
        Epochs (1-based) marked with a labelled vertical line in the phase's panel, e.g.
        ``{"float": {"best": 18, "plateau: lr x 0.1": 15}}``.

    Returns
    -------
    Path
    """
    phases = [p for p in curves if any(len(v) for v in curves[p].values())]
    n_float = max((len(v) for v in curves.get("float", {}).values()), default=0)
    fig = _figure(4.5 * max(1, len(phases)), 3.4)
    for i, phase in enumerate(phases):
        ax = fig.add_subplot(1, max(1, len(phases)), i + 1)
        start = n_float + 1 if phase.startswith("qat") else 1
        colors: dict = {}
        twin = None  # the validation q-risk (another unit than the loss) on its own axis
        if any("q_risk" in n and len(v) for n, v in curves[phase].items()):
            twin = ax.twinx()
            twin.set_ylabel("validation q-risk (normalised, right axis)")
        for j, (name, values) in enumerate(curves[phase].items()):
            if len(values) and not name.startswith("start_"):
                a = twin if (twin is not None and "q_risk" in name) else ax
                x = np.arange(start, start + len(values))
                (line,) = a.plot(x, values, marker="o" if len(values) < 30 else None, ms=3,
                                 label=name, color=f"C{j}")  # fmt: skip
                colors[name] = line.get_color()
        for name, values in curves[phase].items():
            if name.startswith("start_") and len(values):  # epoch 0: before training
                a = twin if (twin is not None and "q_risk" in name) else ax
                a.plot([0], values[:1], marker="D", ls="none", ms=5, color=colors.get(name[6:]),
                       label=f"{name[6:]} at the start")  # fmt: skip
        for j, (label, epoch) in enumerate((events or {}).get(phase, {}).items()):
            ax.axvline(epoch, color=f"C{7 + j}", ls="--", lw=1, label=label)
        ax.set_title(f"{_esc(phase)} phase")
        ax.set_xlabel("epoch" + (" (after the float epochs)" if start > 1 else ""))
        n_ep = max((len(v) for v in curves[phase].values()), default=0)
        first = 0 if any(k.startswith("start_") for k in curves[phase]) else start
        if n_ep <= 40:  # integer epochs as ticks (a one-epoch QAT phase gets one tick)
            every = 1 if start + n_ep - first <= 12 else 2 if n_ep <= 24 else 5
            ax.set_xticks(np.arange(first, start + n_ep, every))
            ax.set_xlim(first - 0.5, start + n_ep - 0.5)
        ax.set_ylabel("quantile loss (standardised)")
        ax.grid(alpha=0.3)
        handles, labels = ax.get_legend_handles_labels()
        if twin is not None:
            h2, l2 = twin.get_legend_handles_labels()
            handles, labels = handles + h2, labels + l2
        ax.legend(handles, labels, fontsize=8)
    return _save(fig, path)


def _fan(ax: Any, tf: np.ndarray, pred: np.ndarray, q: np.ndarray, which: tuple) -> None:
    """One window's band (lowest to highest quantile) and median line; ``pred`` (tau, Q)."""
    lo, hi, mid = which
    band = f"P{round(100 * q[lo])}-P{round(100 * q[hi])}"
    ax.fill_between(tf, pred[:, lo], pred[:, hi], color="C0", alpha=0.3, label=band)
    ax.plot(tf, pred[:, mid], color="C0", lw=1.6, label=f"P{round(100 * q[mid])}")


def plot_forecast_fan(
    history: np.ndarray,
    actual: np.ndarray,
    pred: np.ndarray,
    quantiles: Sequence[float],
    path: str | Path,
    *,
    titles: Sequence[str] | None = None,
    naive: np.ndarray | None = None,
    ridge: np.ndarray | None = None,
    show_history: int = 72,
    ylabel: str = "target",
    xlabel: str = "step relative to forecast start",
    model: str | None = None,
) -> Path:
    """Forecast fan chart for a few windows: P10-P90 band, P50 line, actual values.

    Parameters
    ----------
    history : ndarray (n, k)
        The unscaled target over each window's history (the last ``show_history`` steps shown).
    actual : ndarray (n, tau)
        The unscaled target over the forecast steps.
    pred : ndarray (n, tau, Q)
        Unscaled quantile forecasts; the band spans the lowest to the highest quantile and the
        line is the quantile nearest 0.5.
    quantiles : sequence of float (Q,)
    path : str or Path
    titles : sequence of str, optional
        One title per window.
    naive : ndarray (n, tau), optional
        A baseline point forecast drawn dashed.
    ridge : ndarray (n, tau), optional
        The ridge baseline's median forecast, drawn dotted.
    show_history : int, default 72
    ylabel : str
        The y-axis label: the target's name and unit (e.g. ``temp_air (deg C)``).
    xlabel : str
        The x-axis label: the time step's unit (e.g. ``hours relative to forecast start``).
    model : str, optional
        Which model made the forecast (the figure's title).

    Returns
    -------
    Path
    """
    history = np.asarray(history)
    actual = np.asarray(actual)
    pred = np.asarray(pred)
    n = actual.shape[0]
    q = np.asarray(quantiles)
    lo, hi, mid = int(np.argmin(q)), int(np.argmax(q)), int(np.argmin(np.abs(q - 0.5)))
    ncols = min(n, 2)
    nrows = (n + ncols - 1) // ncols
    fig = _figure(5.5 * ncols, 3.4 * nrows)
    kh = min(show_history, history.shape[1])
    tau = actual.shape[1]
    th = np.arange(-kh, 0)
    tf = np.arange(tau)
    for i in range(n):
        ax = fig.add_subplot(nrows, ncols, i + 1)
        ax.plot(th, history[i, -kh:], color="0.3", lw=1.2, label="history")
        _fan(ax, tf, pred[i], q, (lo, hi, mid))
        ax.plot(tf, actual[i], color="k", lw=1.2, label="actual")
        if naive is not None:
            ax.plot(tf, naive[i], color="C3", ls="--", lw=1.0, label="seasonal naive")
        if ridge is not None:
            ax.plot(tf, ridge[i], color="C2", ls=":", lw=1.4, label="ridge P50")
        ax.axvline(-0.5, color="0.6", lw=0.8)
        if titles is not None:
            ax.set_title(_esc(titles[i]), fontsize=9)
        ax.set(xlabel=_esc(xlabel), ylabel=_esc(ylabel))
        _whole_steps(ax.xaxis)
        ax.grid(alpha=0.3)
        if i == 0:
            ax.legend(fontsize=7)
    if model is not None:
        fig.suptitle(f"{_esc(model)} forecast", fontsize=11)
    return _save(fig, path)


def plot_variable_importance(
    groups: Mapping[str, tuple[Sequence[str], np.ndarray]], path: str | Path
) -> Path:
    """Horizontal bar charts of variable-selection weights, one panel per group.

    Parameters
    ----------
    groups : mapping title -> (names, weights)
        E.g. ``{"static": (names, w), "encoder": (...), "decoder": (...)}``; ``weights`` has
        one value per name (the mean selection weight over windows and time steps).
    path : str or Path

    Returns
    -------
    Path
    """
    items = [(t, list(n), np.asarray(w, dtype=np.float64)) for t, (n, w) in groups.items()]
    fig = _figure(4.2 * max(1, len(items)), 0.8 + 0.32 * max(len(n) for _, n, _ in items))
    for i, (title, names, w) in enumerate(items):
        ax = fig.add_subplot(1, len(items), i + 1)
        order = np.argsort(w)
        ax.barh(np.arange(len(w)), w[order], color="C2")
        ax.set_yticks(np.arange(len(w)), [_esc(names[j]) for j in order], fontsize=8)
        ax.set_title(f"{_esc(title)} variable selection")
        ax.set_xlabel("mean weight")
        ax.grid(alpha=0.3, axis="x")
    return _save(fig, path)


def plot_attention(
    attention: np.ndarray,
    path: str | Path,
    *,
    history: int,
    horizon_steps: Sequence[int] = (),
    unit: str = "step",
) -> Path:
    """The attention pattern: mean weights (tau, T) as an image and a few decoder-step rows.

    Parameters
    ----------
    attention : ndarray (tau, T)
        Attention weights averaged over windows (and heads), T = history + tau.
    path : str or Path
    history : int
        k; key positions are drawn relative to the forecast start (-k ... tau-1).
    horizon_steps : sequence of int, optional
        Decoder steps whose rows are drawn as lines (default: first, middle, last).
    unit : str, default "step"
        The time step's unit for the axis labels (e.g. ``"hours"``).

    Returns
    -------
    Path
    """
    a = np.asarray(attention, dtype=np.float64)
    tau, T = a.shape
    rel = np.arange(T) - history
    steps = list(horizon_steps) or sorted({0, tau // 2, tau - 1})
    fig = _figure(11.0, 3.6)
    ax = fig.add_subplot(1, 2, 1)
    im = ax.imshow(
        a,
        aspect="auto",
        origin="lower",
        extent=(rel[0] - 0.5, rel[-1] + 0.5, -0.5, tau - 0.5),
        cmap="viridis",
    )
    fig.colorbar(im, ax=ax)
    ax.set_xlabel(f"key position ({_esc(unit)} relative to forecast start)")
    ax.set_ylabel("decoder step")
    ax.set_title("mean attention weights")
    ax2 = fig.add_subplot(1, 2, 2)
    for s in steps:
        ax2.plot(rel, a[s], lw=1.0, label=f"decoder step {s}")
    ax2.set_xlabel(f"key position ({_esc(unit)} relative to forecast start)")
    ax2.set_ylabel("weight")
    ax2.set_title("attention of selected decoder steps")
    ax2.grid(alpha=0.3)
    ax2.legend(fontsize=8)
    _whole_steps(ax.xaxis, ax.yaxis, ax2.xaxis)  # key positions and decoder steps
    return _save(fig, path)


def _whole_steps(*axes: Any) -> None:
    """Ticks at whole steps on each of ``axes`` (matplotlib ``Axis`` objects of time steps: a
    fan of 12 months' history and 6 forecast months was ticked -12.5, -7.5, ...)."""
    from matplotlib.ticker import MaxNLocator

    for axis in axes:
        axis.set_major_locator(MaxNLocator("auto", steps=[1, 2, 5, 10], integer=True))


def _plain_log_ticks(ax) -> None:
    """Log-axis tick labels as plain numbers (0.2, 1, 5); minor ticks labelled at 2 and 5 only
    when the axis spans less than two decades (more would crowd)."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    plain = FuncFormatter(lambda v, _: f"{v:g}")
    ax.yaxis.set_major_formatter(plain)
    lo, hi = ax.get_ylim()
    if lo > 0 and hi / lo < 100:
        ax.yaxis.set_minor_locator(LogLocator(subs=(2.0, 5.0)))
        ax.yaxis.set_minor_formatter(plain)
    else:
        ax.yaxis.set_minor_formatter(NullFormatter())


def plot_clipping_comparison(
    runs: Mapping[str, Mapping[str, Sequence[float]]],
    path: str | Path,
    *,
    max_norm: float | None = None,
) -> Path:
    """Clipped vs unclipped QAT: loss per step and pre-clip gradient norm per step.

    Parameters
    ----------
    runs : mapping label -> {"loss": [...], "grad_norm": [...]}
    path : str or Path
    max_norm : float, optional
        The clipping threshold, drawn as a horizontal line on the gradient-norm panel.

    Returns
    -------
    Path
    """
    fig = _figure(11.0, 3.6)
    ax1 = fig.add_subplot(1, 2, 1)
    ax2 = fig.add_subplot(1, 2, 2)
    for label, r in runs.items():
        ax1.plot(np.arange(1, len(r["loss"]) + 1), r["loss"], lw=1.0, label=_esc(label))
        ax2.plot(np.arange(1, len(r["grad_norm"]) + 1), r["grad_norm"], lw=1.0, label=_esc(label))
    if max_norm is not None:
        ax2.axhline(max_norm, color="k", ls=":", lw=1.0, label=f"max_norm = {max_norm:g}")
    ax1.set_xlabel("QAT step")
    ax1.set_ylabel("training loss (standardised)")
    ax1.set_title("QAT loss, clipped vs unclipped")
    ax2.set_xlabel("QAT step")
    ax2.set_ylabel("gradient norm before clipping")
    ax2.set_yscale("log")
    _plain_log_ticks(ax2)
    ax2.set_title("gradient norm")
    for ax in (ax1, ax2):
        ax.grid(alpha=0.3)
        ax.legend()
    return _save(fig, path)


def plot_quantizers(rows: Sequence[Mapping[str, Any]], path: str | Path, top: int) -> Path:
    """SQNR and saturation of the ``top`` worst quantizers (lowest SQNR first).

    Parameters
    ----------
    rows : sequence of mapping
        Rows of :func:`nbqat.train.report.quantizer_report` (``name``, ``kind``, ``values``,
        ``sqnr_db``, ``saturated_fraction``); rows that saw no values are left out.
    path : str or Path
        Output PNG (``quant_report.png``).
    top : int
        How many quantizers to draw.

    Returns
    -------
    Path
    """
    from matplotlib.patches import Patch

    rows = [r for r in rows if r["values"]]
    sq = np.array([np.nan if r["sqnr_db"] is None else r["sqnr_db"] for r in rows], np.float64)
    sq[~np.isfinite(sq)] = np.nan
    order = np.argsort(np.where(np.isnan(sq), np.inf, sq), kind="stable")[:top][::-1]
    fig = _figure(11, 0.28 * len(order) + 1.8)
    ax1, ax2 = fig.add_subplot(1, 2, 1), fig.add_subplot(1, 2, 2)
    names = [_esc(rows[i]["name"].replace("_fake_quant", "")) for i in order]
    colors = ["tab:orange" if rows[i]["kind"] == "weight" else "tab:blue" for i in order]
    y = np.arange(len(order))
    ax1.barh(y, np.nan_to_num(sq[order], nan=0.0), color=colors)
    ax1.set_yticks(y, names, fontsize=7)
    ax1.set_xlabel("SQNR (dB, higher is better)")
    ax2.barh(y, [100.0 * (rows[i]["saturated_fraction"] or 0.0) for i in order], color=colors)
    ax2.set_yticks(y, [""] * len(y))
    ax2.set_xlabel("saturated values (%)")
    handles = [Patch(color="tab:orange", label="weight"), Patch(color="tab:blue",
                                                                label="activation")]  # fmt: skip
    ax2.legend(handles=handles, loc="lower right", fontsize=8)
    fig.suptitle(f"The {len(order)} quantizers with the lowest SQNR (of {len(rows)}; all in "
                 "quant_report.json)")  # fmt: skip
    return _save(fig, path)
