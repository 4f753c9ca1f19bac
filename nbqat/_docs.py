"""Shared numpydoc blocks: one text filled into several docstrings.

The idea of pandas' ``@doc`` / ``Substitution``: a docstring line that holds only ``{name}``
is replaced by the block ``name``, each of its lines indented like the placeholder line, so
the runtime ``__doc__`` (what ``help()``, mkdocstrings and ``tests/test_docstrings.py`` read) is
complete. Under ``python -OO`` (no docstrings) the decorator does nothing.
"""

from __future__ import annotations

import re
import textwrap
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

_SLOT = re.compile(r"^(?P<indent>[ \t]*)\{(?P<name>[A-Za-z_]\w*)\}[ \t]*$", re.MULTILINE)

# The parameters and the return type of every forecaster's forward / predict (TFT, LSTM, their
# QAT and int8 forms); the docstring adds the return value's description after it.
FORECAST_IO = """\
Parameters
----------
static : ndarray (B, num_static_features)
    Static inputs, float32 or float64 ({cast}).
historical : ndarray (B, input_length, num_unknown_features)
    Observed past inputs (``config.input_length`` steps: ``sequence_length``, or the TFT's
    longer ``skip_sequence_length``).
future : ndarray (B, prediction_horizon, num_known_features)
    Known future inputs of the decoder steps.

Returns
-------
ndarray (B, prediction_horizon, num_quantiles){out}"""

# The contract of a forecaster's ``backward``.
BACKWARD_IO = """\
Gradients are added (``+=``) to the flat buffer; call :meth:`zero_grad` first.

Parameters
----------
grad_out : ndarray (B, prediction_horizon, num_quantiles)
    Gradient w.r.t. the output of the last :meth:`forward` (e.g.
    :func:`~nbqat.nn.quantile_loss_grad`){cast}.

Returns
-------
dstatic : ndarray (B, num_static_features)
    Gradient w.r.t. ``static``.
dhistorical : ndarray (B, input_length, num_unknown_features)
    Gradient w.r.t. ``historical``.
dfuture : ndarray (B, prediction_horizon, num_known_features)
    Gradient w.r.t. ``future``. All three in the model's dtype."""

# What a layer's ``backward`` raises: ``Module._require_forward`` before any forward, and
# ``Module._grad_in`` for a gradient of another shape than the last forward's output.
LAYER_BACKWARD_RAISES = """\
Raises
------
RuntimeError
    When called before :meth:`forward`.
ValueError
    When ``dy`` does not have the shape of the last forward's output."""

# What the QAT -> integer conversion returns and raises.
INT8_RESULT = """\
Returns
-------
Int8Model

Raises
------
UncalibratedError
    A quantizer has never observed data (calibrate first; a RuntimeError and a ValueError)."""

# The mask argument and the results of every ``*_cachemask`` fake quantization (fake_quant,
# affine, float8); ``{y}`` is the output's type, the docstring describes the mask after it.
CACHEMASK_IO = """\
mask : bool array of ``x``'s shape, optional
    Preallocated mask output.

Returns
-------
y : {y}
mask : bool array of ``x``'s shape"""

# What an observer's ``merge`` returns and raises; the docstring says why after it.
MERGE_RESULT = """\
Returns
-------
self

Raises
------
TypeError, ValueError"""


def fill_doc(**blocks: str) -> Callable[[T], T]:
    """Decorator: fill each ``{name}`` line of the object's docstring with ``blocks[name]``.

    Parameters
    ----------
    **blocks : str
        The shared texts, written without indentation (``textwrap.dedent`` is applied).

    Returns
    -------
    callable
        The decorator; it sets ``obj.__doc__`` and returns ``obj`` itself.

    Raises
    ------
    ValueError
        A ``{name}`` line without a block, or a block that no line uses (a typo either way).
    """
    texts = {k: textwrap.dedent(v).strip("\n") for k, v in blocks.items()}

    def decorate(obj: T) -> T:
        doc = obj.__doc__
        if doc is None:  # python -OO
            return obj
        used: set[str] = set()

        def fill(m: re.Match[str]) -> str:
            name = m.group("name")
            if name not in texts:
                raise ValueError(f"{obj!r}: docstring line {{{name}}} has no block")
            used.add(name)
            ind = m.group("indent")
            return "\n".join(ind + ln if ln.strip() else "" for ln in texts[name].splitlines())

        new = _SLOT.sub(fill, doc)
        if used != set(texts):
            raise ValueError(f"{obj!r}: blocks {sorted(set(texts) - used)} are not used")
        obj.__doc__ = new
        return obj

    return decorate
