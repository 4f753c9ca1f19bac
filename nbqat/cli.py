"""The ``nbqat`` command line (``nbqat train ...`` or ``python -m nbqat train ...``)."""

from __future__ import annotations

import argparse
import math
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from nbqat.train.model import CSV_COLUMN_OPTIONS
from nbqat.train.parser import build_parser
from nbqat.train.summary import q_text

__all__ = ["build_parser", "main"]


#: Options a ``--resume`` may give: they change no result.
_RESUME_FREE = ("command", "resume", "no_progress", "stop_after_steps", "check", "overwrite")


def _given(argv: Sequence[str]) -> set[str]:
    """The ``nbqat train`` options written on the command line ``argv`` (their dests).

    An option given at its default value (``--model tft``, ``--seed 0``) counts as given: a
    ``--resume`` compares it with the checkpoint's value instead of ignoring it.
    """
    p = build_parser()
    sub = next(a for a in p._actions if isinstance(a, argparse._SubParsersAction))
    train = sub.choices["train"]
    for a in train._actions:
        a.default = argparse.SUPPRESS
    return set(vars(p.parse_args(list(argv)))) - {"command"}


def _same_as_saved(k: str, v: object, was: object) -> bool:
    """Whether option ``k`` given as ``v`` restates the checkpoint's resolved value ``was``.

    Paths compare resolved; a float compares to 1e-9 relative (``--qat-lr 0.0003`` restates
    the ``--lr / 10`` the run stored, 0.00030000000000000003); a word (``--history auto``)
    restates the value the run resolved it to (the checkpoint keeps the value, not the word,
    so a run started with that value given as a number is taken too: it continues with it).
    """
    from nbqat.train.options import options

    o = options("train").get(k)
    if k == "out":
        return Path(str(v)).resolve() == Path(str(was)).resolve()
    if k == "csv":
        return was is not None and Path(str(v)).resolve() == Path(str(was))
    if o is not None and isinstance(v, str) and v in o.words:
        return v == was or (was is not None and not isinstance(was, str))
    if o is not None and o.type is float and isinstance(v, float) and isinstance(was, float):
        return math.isclose(v, was, rel_tol=1e-9)
    return v == was


def _resume_conflicts(args: argparse.Namespace, argv: Sequence[str]) -> None:
    """Raise ValueError for options given with --resume that differ from the checkpoint's."""
    from nbqat.train.checkpointing import read_run_state
    from nbqat.train.options import options

    explicit = _given(argv) - set(_RESUME_FREE)
    given = [k for k in vars(args) if k in explicit]  # in --help's order
    if not given:
        return
    meta = read_run_state(args.resume)
    saved = meta["config"]
    bad = []
    for k in given:
        v = getattr(args, k)
        if k == "no_plots":
            k, v = "plots", not v
        was = saved.get(k)
        if not _same_as_saved(k, v, was):
            opt, o = "--" + k.replace("_", "-"), options("train").get(k)
            null = o.none_words[0] if o is not None and o.none_words else None
            if isinstance(v, bool):  # the flag as typed: --no-plots, --compare-clipping
                bad.append(f"{opt if v else '--no-' + opt[2:]} (the checkpoint has {k}={was})")
            else:  # a missing value as typed: --max-norm none
                v, was = (null if x is None and null else x for x in (v, was))
                bad.append(f"{opt} {v!r} (the checkpoint has {was!r})")
    if bad:
        raise ValueError(
            "--resume continues a run with the options it started with; these conflict with "
            f"the checkpoint: {'; '.join(bad)}. Drop them (or start a new run with another --out)"
        )


def _model(args: argparse.Namespace, argv: Sequence[str] | None) -> str:
    """The ``--model`` of the run: with ``--resume`` (and no ``--model``) the checkpoint's.

    A resumed LSTM run must refuse ``--heads`` / ``--dropout`` as a new one does: checked
    against the parser's default (tft), they were taken silently when they matched the
    checkpoint's unread value.
    """
    if args.resume is None or "model" in _given(sys.argv[1:] if argv is None else argv):
        return str(args.model)
    from nbqat.train.checkpointing import read_run_state

    return str(read_run_state(args.resume)["config"].get("model", "tft"))


def _root() -> bool:
    """True unless this is a rank other than 0 of an MPI run (which prints nothing)."""
    from nbqat.distributed import init_process_group

    return init_process_group().rank == 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``nbqat`` console script; returns the exit status.

    Exit status 0 on success, 2 on a usage or data error (a one-line message, no traceback),
    130 when interrupted (Ctrl-C; a checkpoint was saved).
    """
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    if args.command == "train":
        if args.csv is None:
            given = [
                f"--{n.replace('_', '-')}"
                for n in CSV_COLUMN_OPTIONS
                if getattr(args, n) is not None
            ]
            if given:
                parser.error(f"{', '.join(given)} need --csv PATH")
        elif args.time_col is None or args.target_col is None:
            parser.error("--csv needs --time-col and --target-col")
        from nbqat.data import DataError
        from nbqat.forecaster import Forecaster
        from nbqat.train import TrainConfig, TrainingInterrupted
        from nbqat.train.options import (
            check_model_options,
            check_qat_options,
            check_skip_options,
        )

        try:
            cfg = TrainConfig.from_args(args)
            typed = _given(sys.argv[1:] if argv is None else argv)
            check_model_options(_model(args, argv), typed)
            if args.resume is None:  # given at its default, as for the model's options
                check_skip_options(args.linear_skip is not False, typed)  # None: not given
                check_qat_options(args.qat_epochs, typed)
            if args.resume is not None:
                _resume_conflicts(args, sys.argv[1:] if argv is None else argv)
            fc = Forecaster().train(cfg, resume=args.resume, check=args.check)
            res = fc.result or {}
            if args.check and _root():
                d = res["data"]
                print(
                    f"nbqat train --check: OK: {len(d['entities'])} series, windows "
                    f"{d['windows']}, filled {d['filled'] or 0}; nothing written"
                )
            elif fc.run_dir is not None and _root():
                _print_run(fc.run_dir)
        except TrainingInterrupted as e:
            if _root():  # under MPI every rank stopped at the same step: one message
                print(f"\n{e}", file=sys.stderr)
            return 130
        except (DataError, ValueError, FileNotFoundError, RuntimeError) as e:
            if isinstance(e, RuntimeError) and not getattr(e, "nbqat_user_error", False):
                raise
            print(f"nbqat train: error: {e}", file=sys.stderr)
            return 2
        return 0
    if args.command in ("predict", "backtest"):
        return _predict(args)
    parser.error(f"unknown command {args.command!r}")  # pragma: no cover
    return 2


def _print_run(out: Path) -> None:
    """The finished run's summary (its ``summary.txt``) and the files it wrote."""
    print((out / "summary.txt").read_text().rstrip("\n"))
    names = sorted(p.name + ("/" if p.is_dir() else "") for p in out.iterdir()
                   if not p.name.startswith("."))  # fmt: skip
    print(f"outputs in {out.resolve()}: {', '.join(names)}")


def _predict(args: argparse.Namespace) -> int:
    """``nbqat predict`` / ``nbqat backtest``: :class:`nbqat.Forecaster` and one CSV."""
    from nbqat.data import DataError
    from nbqat.forecaster import Forecaster
    from nbqat.train.predict import check_out, own_data, write_csv

    name = f"nbqat {args.command}"
    backtest = args.command == "backtest" or getattr(args, "backtest", False)
    try:
        if backtest and getattr(args, "at", None) is not None:
            raise ValueError(
                "--at and --backtest exclude each other: --start sets the first origin"
            )
        if not backtest and (args.start is not None or args.stride is not None):
            raise ValueError("--start and --stride need --backtest (or nbqat backtest)")
        default = "backtest.csv" if backtest else "forecasts.csv"  # predict, then backtest
        out = Path(args.out) if args.out is not None else Path(args.run_dir) / default
        stdout = args.out == "-"  # the CSV on standard output, the messages on stderr
        if Path(args.run_dir).is_dir() and not stdout:
            check_out(out, args.overwrite)  # before anything is computed
        if args.csv is not None and not Path(args.csv).is_file():
            raise FileNotFoundError(f"--csv {args.csv!r} does not exist")
        fc = Forecaster.load(args.run_dir)
        data = args.csv if args.csv is not None else own_data(args.run_dir)  # text keys
        if backtest:
            df = fc.backtest(data, start=args.start, stride=args.stride,
                             engine=args.engine, fill_gaps=args.fill_gaps)  # fmt: skip
        else:
            df = fc.predict(data, at=args.at, engine=args.engine, fill_gaps=args.fill_gaps)
        path = None if stdout else write_csv(df, out, args.overwrite)
    except (DataError, ValueError, FileNotFoundError) as e:
        print(f"{name}: error: {e}", file=sys.stderr)
        return 2
    msg = sys.stderr if stdout else sys.stdout
    if backtest:
        qr = df.attrs["q_risk"]
        n = df[["entity", "origin"]].drop_duplicates().shape[0]
        print(f"backtest q-risk over {n} window{'s' if n != 1 else ''}: "
              + ", ".join(f"{k} {q_text(v)}" for k, v in qr.items()), file=msg)  # fmt: skip
    if path is None:
        try:
            df.to_csv(sys.stdout, index=False, lineterminator="\n")
            sys.stdout.flush()
        except BrokenPipeError:  # the reader left (| head): stop quietly, as line tools do
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no flush error
            return 141  # 128 + SIGPIPE, the status of a tool the signal stopped
    else:
        print(f"wrote {path}")
    return 0
