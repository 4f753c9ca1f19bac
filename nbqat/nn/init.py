"""Parameter initialisers (torch's ``torch.nn.init``): an :data:`Init` draws a float64 array of
a given shape from the model's random stream; :meth:`nbqat.nn.Module.declare` takes one per
parameter and :class:`~nbqat.nn.ParameterBuffer` calls them in traversal order."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

__all__ = ["Init", "constant_init", "uniform_init"]

Init = Callable[[np.random.Generator, tuple[int, ...]], np.ndarray]


def uniform_init(bound: float) -> Init:
    """``U(-bound, bound)`` (torch's default for nn.Linear / nn.LSTM with bound 1/sqrt(fan)).

    Parameters
    ----------
    bound : float
        Half-width of the interval, >= 0.

    Returns
    -------
    Init
        ``init(rng, shape)`` drawing a float64 array of ``shape`` from ``rng.uniform``.
    """

    def init(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
        return rng.uniform(-bound, bound, size=shape)

    return init


def constant_init(value: float) -> Init:
    """All entries equal to ``value``.

    Parameters
    ----------
    value : float
        The constant (e.g. 1.0 for a LayerNorm weight, 0.0 for its bias).

    Returns
    -------
    Init
        ``init(rng, shape)`` returning a float64 array of ``shape`` filled with ``value``
        (``rng`` is not used, so the random stream of later parameters does not move).
    """

    def init(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
        return np.full(shape, value, dtype=np.float64)

    return init
