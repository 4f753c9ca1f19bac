"""The ``nbqat`` argument parser: ``nbqat train``, ``predict`` and ``backtest``.

Every option, its type, default, range and help come from the registry
:data:`nbqat.train.options.OPTIONS`; :mod:`nbqat.cli` runs what this module parses.
"""

from __future__ import annotations

import argparse
import difflib
import sys
from collections.abc import Callable
from typing import Any

from nbqat.train.options import GROUPS, Option, expected, options, problem

__all__ = ["add_options", "build_parser"]


class _Parser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line (``nbqat train: error: ...``), not the
    usage block; a misspelt option gets the closest option of its command as a suggestion."""

    def parse_known_args(self, args: Any = None, namespace: Any = None) -> Any:
        self._argv = list(sys.argv[1:] if args is None else args)
        return super().parse_known_args(args, namespace)

    def error(self, message: str) -> Any:  # type: ignore[override]
        hint = _suggestion(self, message)
        self.exit(2, f"{self.prog}: error: {message}{hint} (see {self.prog} --help)\n")


def _suggestion(parser: argparse.ArgumentParser, message: str) -> str:
    """``"; did you mean --hidden?"`` for ``unrecognized arguments: --hiden``: the closest
    option strings of the command named on the command line (difflib's ratio >= 0.6)."""
    if not message.startswith("unrecognized arguments:"):
        return ""
    known = [o for a in parser._actions for o in a.option_strings]
    argv = getattr(parser, "_argv", [])
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            command = next((a for a in argv if a in action.choices), None)
            if command is not None:
                known += [o for a in action.choices[command]._actions for o in a.option_strings]
    pairs = []  # (misspelt, closest)
    for token in message.split(":", 1)[1].split():
        name = token.split("=", 1)[0]
        close = difflib.get_close_matches(name, known, n=1) if name.startswith("--") else []
        if close:
            pairs.append((name, close[0]))
    if len(pairs) == 1:
        return f"; did you mean {pairs[0][1]}?"
    tips = ", ".join(f"{good} for {bad}" for bad, good in pairs)
    return f"; did you mean {tips}?" if pairs else ""


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``nbqat`` command."""
    p = _Parser(
        prog="nbqat",
        description="nbqat: quantization-aware training on NumPy + Numba.",
    )
    from nbqat._version import __version__

    p.add_argument("--version", action="version", version=f"nbqat {__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    t = sub.add_parser(
        "train",
        help="train the TFT-like forecaster: float, calibration, QAT, int8, evaluation",
        description=(
            "Train the TFT-like forecaster end to end: float training (AdamW, warm-up + cosine "
            "schedule, dropout, a linear skip started at the ridge fit) with early stopping on "
            "the validation q-risk, observer calibration, QAT fine-tuning through fake "
            "quantization (STE, clip_grad_norm_), conversion to int8, and evaluation (q-risk on "
            "the test split against a seasonal-naive and a ridge baseline, and the float "
            "model fine-tuned as long as QAT and post-training quantization). Without --csv it "
            "uses the shipped dataset (NREL TMY3 hourly weather, two stations; forecast the "
            "dry-bulb temperature 24 h ahead from one day of history)."
        ),
    )
    add_options(t, "train")
    _add_predict(sub)
    return p


def _add_predict(sub: Any) -> None:
    pr = sub.add_parser(
        "predict",
        help="forecast the steps after each series' last target value with a finished run",
        description=(
            "Load a finished run (model, stored scaling, column names) and forecast the "
            "--horizon steps after each series' last row with a target value. Rows after it "
            "may be in the data with the target (and observed columns) empty and the known "
            "columns filled: their known values are used; calendar features come from the "
            "timestamps. Inputs are standardised with the run's stored (training) scaling. "
            "Writes one row per entity and forecast step: entity,time,step,p10,p50,p90."
        ),
    )
    add_options(pr, "predict")
    bt = sub.add_parser(
        "backtest",
        help="rolling-origin forecasts of a finished run with actuals, and their q-risk",
        description=(
            "Forecast from every --stride steps from --start, keep the windows whose forecast "
            "steps all have target values, write them with the column actual and print the "
            "q-risk per quantile."
        ),
    )
    add_options(bt, "backtest")


def _value_type(o: Option) -> Callable[[str], Any]:
    """The argparse ``type`` of a value option: convert, then the registry's range check."""
    conv: Callable[[str], Any] = {"int": int, "float": float}.get(o.type.__name__, str)
    null = repr(o.none_words[0]) if o.none_words else "none"

    def parse(s: str) -> Any:
        if s.lower() in o.none_words:
            return None
        if s in o.words:
            return s
        try:
            v = conv(s)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {expected(o, null)}, got {s!r}") from None
        if o.choices is None and problem(o, v) is not None:
            raise argparse.ArgumentTypeError(f"expected {expected(o, null)}, got {s!r}")
        return v

    parse.__name__ = f"{o.type.__name__}_{o.name}"
    return parse


def _help(o: Option, command: str) -> str:
    """``o.help`` with the registry's default, and for ``--model`` the options it refuses."""
    text = o.help
    if o.name == "model":
        for m in o.choices or ():
            others = [x.flag for x in options(command).values() if m not in x.models]
            if others:
                text += f"; {', '.join(others)} are not read by {m}: an error with it"
    default = o.default_text()
    return text + (f" [default: {default}]" if default is not None else "")


def add_options(parser: Any, command: str) -> None:
    """Add ``command``'s options of :data:`nbqat.train.options.OPTIONS` to ``parser``, each
    in its group (:data:`~nbqat.train.options.GROUPS`), in the registry's order."""
    groups: dict[str, Any] = {}
    for o in options(command).values():
        if o.group not in groups:
            title = GROUPS[o.group]
            groups[o.group] = parser.add_argument_group(title) if title else parser
        g = groups[o.group]
        names = (o.flag, *o.aliases)
        help_ = argparse.SUPPRESS if o.cli == "hidden" else _help(o, command)
        if o.cli == "positional":
            g.add_argument(o.name, metavar=o.metavar, help=help_)
        elif o.cli in ("flag", "negated"):
            default = False if o.cli == "negated" else o.default  # --no-plots: plots=False
            g.add_argument(*names, action="store_true", default=default, help=help_)
        elif o.cli == "bool":
            g.add_argument(*names, action=argparse.BooleanOptionalAction, default=None, help=help_)
        else:
            typ = int if o.choices is not None and o.type is int else None
            g.add_argument(
                *names, dest=o.name, default=o.default, metavar=o.metavar, help=help_,
                choices=o.choices, type=typ or (_value_type(o) if o.choices is None else None),
            )  # fmt: skip
