"""The README's held-out table from the runs' ``metrics.json`` and ``timings.json``."""

from __future__ import annotations

import json
from pathlib import Path


def _seeds(run: Path) -> list[tuple[int, dict, dict]]:
    """(seed, metrics, timings) of each ``run/seed<S>`` folder with a finished run."""
    found = []
    for d in sorted(run.glob("seed*")):
        m = d / "metrics.json"
        if m.is_file():
            t = d / "timings.json"
            timings = json.loads(t.read_text()) if t.is_file() else {}
            found.append((int(d.name[4:]), json.loads(m.read_text()), timings))
    return found


def _p(m: dict, key: str) -> float | None:
    return m["significance"][f"{key}_vs_ridge_P50"]["p_value_hln"]


def _fmt_p(p: float | None) -> str:
    return "n/a" if p is None else f"{p:.2g}"


def _wall(t: dict) -> float | None:
    """The job's own wall time (``timings.json``, the sum of its phases)."""
    v = t.get("phases_s", {}).get("total")
    return float(v) if isinstance(v, int | float) else None


def peers(out: Path) -> dict[str, float]:
    """``set -> P50`` of the peer lines in ``out/peers.jsonl`` (``peer_autoets.py``'s output)."""
    path = Path(out) / "peers.jsonl"
    if not path.is_file():
        return {}
    lines = [json.loads(x) for x in path.read_text().splitlines() if x.startswith("{")]
    return {d["set"]: d["q_risk_test"]["P50"] for d in lines}


def row(name: str, runs: list[tuple[int, dict, dict]], peer: float | None = None) -> str:
    """One markdown row: the baselines (seed 0's; they do not depend on the seed), then per
    seed the float and int8 P50, the float's gain over the tuned ridge with its
    Diebold-Mariano HLN p-value, and the mean gain."""
    qr0 = runs[0][1]["q_risk_test"]
    f = [m["q_risk_test"]["float"]["P50"] for _, m, _ in runs]
    q = [m["q_risk_test"]["int8"]["P50"] for _, m, _ in runs]
    ft = [m["q_risk_test"]["float_finetuned"]["P50"] for _, m, _ in runs]
    ridge = [m["q_risk_test"]["ridge"]["P50"] for _, m, _ in runs]
    gain = [100 * (1 - a / r) for a, r in zip(f, ridge)]
    qgap = [100 * (a / b - 1) for a, b in zip(q, ft)]
    walls = [_wall(t) for _, _, t in runs]
    n = runs[0][1]["data"].get("windows", {}).get("test", "?")
    mean = sum(gain) / len(gain)
    worse = any(g < 0 and (_p(m, "float") or 1) < 0.05 for g, (_, m, _) in zip(gain, runs))
    goal = "met" if mean >= 5 and not worse else "not met"
    cells = [
        f"`{name}`",
        str(n),
        f"{qr0['seasonal_naive']['P50']:.4g}",
        " / ".join(f"{r:.4g}" for r in dict.fromkeys(ridge)),
        "n/a" if peer is None else f"{peer:.4g}",
        " / ".join(f"{a:.4g}" for a in f),
        " / ".join(f"{a:.4g}" for a in q),
        " / ".join(f"{g:+.1f} % (p {_fmt_p(_p(m, 'float'))})" for g, (_, m, _) in zip(gain, runs)),
        f"{mean:+.1f} %",
        " / ".join(_fmt_p(_p(m, "int8")) for _, m, _ in runs),
        " / ".join(f"{g:+.2f} %" for g in qgap),
        " / ".join("?" if w is None else f"{w:.0f}" for w in walls),
        goal,
    ]
    return "| " + " | ".join(cells) + " |"


HEADER = (
    "| set | test windows | seasonal naive P50 | tuned ridge P50 | AutoETS P50 | float P50 (seeds "
    "0 / 1 / 2) | QAT int8 P50 | float vs ridge (DM p, HLN) | mean | int8 vs ridge p | "
    "int8 vs float fine-tuned | wall s | 5 % goal |\n"
    "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"
)


def table(out: Path, names: list[str]) -> str:
    """The markdown table of every set of ``names`` with a finished run under ``out``."""
    ets = peers(out)
    rows = [row(n, r, ets.get(n)) for n in names if (r := _seeds(Path(out) / n))]
    return "\n".join([HEADER, *rows])
