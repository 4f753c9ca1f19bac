"""The one registry of the main job's options: :data:`OPTIONS`, one :class:`Option` each.

Every option of ``nbqat train``, ``nbqat predict`` and ``nbqat backtest`` is defined here once
(name, type, default, range or choices, help, the models and commands it applies to). Built
from it:

* the argparse options (:func:`nbqat.train.parser.build_parser`; the ``[default: ...]`` of each
  help text is :meth:`Option.default_text`);
* :class:`~nbqat.train.TrainConfig`'s field defaults, its ``FULL`` / ``QUICK`` defaults and its
  range checks (:func:`check_option`);
* the range checks of a checkpoint's ``config`` (:func:`config_checks`, handed to
  :func:`nbqat.train.checkpoint_schema.read_state`, which repeats no rule);
* :class:`nbqat.Forecaster`'s keyword validation (:func:`check_options`);
* the options table of the documentation (``docs/options.md``,
  :func:`nbqat.train.option_doc.markdown`;
  regenerate it with ``python -m nbqat.train.option_doc docs/options.md``).

An option that the chosen ``--model`` does not read (:attr:`Option.models`) is an error naming
the option and the model (:func:`check_model_options`), never silently ignored.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Iterable, Mapping
from numbers import Integral, Real
from typing import Any

from nbqat.train import option_table
from nbqat.train.option_table import *  # noqa: F403 (its __all__: read the table here)
from nbqat.train.option_table import COMMANDS, OPTIONS, Option

__all__ = [
    "check_model_options",
    "check_option",
    "check_options",
    "check_qat_options",
    "check_skip_options",
    "config_checks",
    "config_options",
    "expected",
    "legacy_values",
    "mode_defaults",
    "options",
    "problem",
    "unused_options",
]
__all__ += option_table.__all__  # the table's names, read through this module


def options(command: str) -> dict[str, Option]:
    """``{name: Option}`` of one command (``"train"``, ``"predict"`` or ``"backtest"``).

    Raises
    ------
    ValueError
        For another command.
    """
    if command not in COMMANDS:
        raise ValueError(f"unknown command {command!r}: one of {', '.join(COMMANDS)}")
    return {o.name: o for o in OPTIONS if command in o.commands}


def config_options() -> dict[str, Option]:
    """``{name: Option}`` of :class:`~nbqat.train.TrainConfig`'s fields (in field order)."""
    return {o.name: o for o in OPTIONS if o.field}


def mode_defaults(quick: bool) -> dict[str, Any]:
    """``{name: default}`` that :meth:`TrainConfig.resolved` fills in for ``None`` (the full
    run's, or ``--quick``'s)."""
    out = {}
    for o in config_options().values():
        if o.full is not Option.UNSET:
            out[o.name] = o.quick if quick and o.quick is not Option.UNSET else o.full
    return out


# ------------------------------------------------------------------------------------ checks
def expected(o: Option, null: str = "None") -> str:
    """What ``o`` accepts, as in "expected <this>" (``null``: the word for a missing value)."""
    if o.choices is not None:
        what = "one of " + ", ".join(repr(c) for c in o.choices)
    elif o.type is bool:
        what = "a bool"
    elif o.type is str:
        what = "a string"
    else:
        what = _range_text(o)
    what += "".join(f" or {w!r}" for w in o.words)
    if o.nullable:
        what += " or " + null
    return what


def _range_text(o: Option) -> str:
    """``o``'s type and bounds in words: "a positive integer", "an integer >= 0", "a positive
    finite number", "a number in [0, 1)"..."""
    integer = o.type is int
    kind = "integer" if integer else "finite number"
    lo, hi = o.low, o.high
    if hi is None and (lo == 1 and integer or lo == 0 and o.low_open):
        return f"a positive {kind}"
    if hi is None and lo is not None:
        return f"{'an' if integer else 'a'} {kind} {'>' if o.low_open else '>='} {lo}"
    if lo is None and hi is None:
        return f"{'an' if integer else 'a'} {kind}"
    left, right = "(" if o.low_open else "[", ")" if o.high_open else "]"
    return f"{'an integer' if integer else 'a number'} in {left}{lo}, {hi}{right}"


def problem(o: Option, v: Any, *, resolved: bool = False, null: str = "None") -> str | None:
    """Why ``v`` is not a valid value of ``o`` ("expected ..., got ..."), or None when it is.

    Parameters
    ----------
    o : Option
    v : object
    resolved : bool, default False
        A resolved configuration (a checkpoint's): None only where :attr:`Option.nullable`;
        otherwise also where the default is None (the mode fills it in).
    null : str, default "None"
        The word for a missing value in the message (``"null"`` for JSON).
    """
    if v is None:
        ok = o.nullable or (not resolved and o.default is None)
        return None if ok else f"expected {expected(o, null)}, got {null}"
    if isinstance(v, str) and v in o.words:
        return None
    if o.choices is not None:
        ok = _type_ok(o, v, resolved) and v in o.choices
    else:
        ok = _type_ok(o, v, resolved) and (o.type not in (int, float) or _in_range(o, v))
    return None if ok else f"expected {expected(o, null)}, got {v!r}"


def _type_ok(o: Option, v: Any, resolved: bool) -> bool:
    if o.type is bool:
        return isinstance(v, bool)
    if isinstance(v, bool):
        return False
    if o.type is int:
        return isinstance(v, Integral)
    if o.type is float:
        return isinstance(v, Real)
    return isinstance(v, str) or (not resolved and o.path and isinstance(v, os.PathLike))


def _in_range(o: Option, v: Any) -> bool:
    if isinstance(v, float) and not math.isfinite(v):
        return False
    if o.low is not None and not (v > o.low if o.low_open else v >= o.low):
        return False
    return o.high is None or (v < o.high if o.high_open else v <= o.high)


def check_option(name: str, v: Any, command: str = "train") -> None:
    """Raise ValueError ``--<name> must be <expected>, got <v>`` for an invalid value.

    Parameters
    ----------
    name : str
        The option (a :class:`~nbqat.train.TrainConfig` field name).
    v : object
    command : str, default "train"
    """
    o = options(command)[name]
    why = problem(o, v)
    if why is not None:
        raise ValueError(f"{o.flag} must be {why.removeprefix('expected ')}")


def check_options(given: Mapping[str, Any], command: str = "train") -> None:
    """:func:`check_option` of every ``{name: value}`` in ``given``, then the run's checks of
    options it would not use, as ``nbqat train`` makes them: :func:`check_model_options` for
    the ``model`` (given, or the default), :func:`check_skip_options` and
    :func:`check_qat_options`. A name counts as given unless its value is None (the default)
    or False for a switch (``compare_clipping=False``: the switch not given).

    Raises
    ------
    TypeError
        For a name that is not an option of ``command`` (the message lists them).
    ValueError
        For an invalid value or an option that the run does not read (naming it).
    """
    known = options(command)
    bad = sorted(set(given) - set(known))
    if bad:
        raise TypeError(f"unknown option(s) {bad}; {command}'s options: {', '.join(known)}")
    for k, v in given.items():
        check_option(k, v, command)
    names = [k for k, v in given.items() if v is not None and (known[k].cli != "flag" or v)]
    if "model" in known:
        check_model_options(given.get("model", known["model"].default), names)
    if "linear_skip" in known and "qat_epochs" in known:
        check_skip_options(given.get("linear_skip") is not False, names)
        check_qat_options(given.get("qat_epochs"), names)


def check_model_options(model: str, given: Iterable[str]) -> None:
    """Raise ValueError for an option of ``given`` that ``model`` does not read.

    Parameters
    ----------
    model : str
        The ``--model`` value.
    given : iterable of str
        The options set explicitly (names; those not in the registry are ignored).

    Raises
    ------
    ValueError
        One line naming the option and the model: ``--heads is not used by --model lstm``.
    """
    train = options("train")
    for name in given:
        o = train.get(name)
        if o is not None and model not in o.models:
            raise ValueError(
                f"{o.flag} is not used by --model {model} (only by --model "
                f"{', '.join(o.models)}): drop {o.flag}, or choose --model {o.models[0]}"
            )


#: The options of the linear skip (an error with ``--no-linear-skip``).
SKIP_OPTIONS = ("skip_lr_scale", "qat_skip_lr_scale", "skip_history")
#: The options of the QAT steps (an error with ``--qat-epochs 0``).
QAT_OPTIONS = ("qat_lr", "qat_skip_lr_scale", "compare_clipping")


def unused_options(config: Mapping[str, Any]) -> set[str]:
    """The options a (resolved) configuration ``config`` holds but its run does not read:
    another model's, the linear skip's without the skip, the QAT steps' with ``qat_epochs``
    0 (what :meth:`nbqat.Forecaster.load` leaves out of a run's options, which
    :func:`check_options` would refuse).

    Parameters
    ----------
    config : mapping
        ``{option: value}``, e.g. a run's ``state.json`` / ``metrics.json`` config.

    Returns
    -------
    set of str
    """
    opts = config_options()
    model = config.get("model", opts["model"].default)
    out = {k for k in config if k in opts and model not in opts[k].models}
    if config.get("linear_skip") is False:
        out.update(SKIP_OPTIONS)
    if config.get("qat_epochs") == 0:
        out.update(QAT_OPTIONS)
    return out


def check_skip_options(linear_skip: bool, given: Iterable[str]) -> None:
    """Raise ValueError for an option of the linear skip in ``given`` without the skip.

    Parameters
    ----------
    linear_skip : bool
        ``--linear-skip`` (False: ``--no-linear-skip``).
    given : iterable of str
        The options set explicitly (names; an option given at its default counts).

    Raises
    ------
    ValueError
        Naming the option and ``--no-linear-skip`` (the option would be ignored).
    """
    _refuse_unused(
        given, SKIP_OPTIONS, linear_skip,
        "the linear skip", "--no-linear-skip removes the skip", "--no-linear-skip",
    )  # fmt: skip


def check_qat_options(qat_epochs: int | None, given: Iterable[str]) -> None:
    """Raise ValueError for an option of the QAT steps in ``given`` with ``--qat-epochs 0``.

    Parameters
    ----------
    qat_epochs : int or None
        ``--qat-epochs`` (None: the mode's default, never 0).
    given : iterable of str
        The options set explicitly (names).

    Raises
    ------
    ValueError
        Naming the option and ``--qat-epochs 0`` (the option would be ignored).
    """
    _refuse_unused(
        given, QAT_OPTIONS, qat_epochs != 0,
        "the QAT steps", "--qat-epochs 0 runs none", "raise --qat-epochs",
    )  # fmt: skip


def _refuse_unused(
    given: Iterable[str], names: tuple[str, ...], used: bool, what: str, why: str, fix: str
) -> None:
    """ValueError naming the first of ``names`` in ``given`` when the run will not use them
    (``used`` False): ``--OPT is an option of WHAT, but WHY: drop --OPT or FIX``."""
    found = [k for k in names if k in given]
    if found and not used:
        opt = "--" + found[0].replace("_", "-")
        raise ValueError(f"{opt} is an option of {what}, but {why}: drop {opt} or {fix}")


def config_checks() -> dict[str, Callable[[Any], str | None]]:
    """``{field: check}`` of a checkpoint's ``config`` (a resolved configuration): ``check(v)``
    says what is wrong with ``v`` ("expected ..., got ...") or returns None; handed to
    :func:`nbqat.train.checkpoint_schema.read_state`."""

    def checker(o: Option) -> Callable[[Any], str | None]:
        return lambda v: problem(o, v, resolved=True, null="null")

    return {name: checker(o) for name, o in config_options().items()}


def legacy_values() -> dict[str, Any]:
    """``{field: value}`` of the options a checkpoint written before they existed may lack,
    with what their absence means (:attr:`Option.legacy`); handed to
    :func:`nbqat.train.checkpoint_schema.read_state`."""
    return {n: o.legacy for n, o in config_options().items() if o.legacy is not Option.UNSET}
