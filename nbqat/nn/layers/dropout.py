"""Dropout with a reproducible mask and its backward pass (inverted dropout, as torch)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any

import numpy as np

from nbqat import _validate as V
from nbqat.kernels.dropout_cpu import dropout_forward
from nbqat.nn.params import Module

__all__ = ["Dropout", "dropout_off", "global_masks", "set_dropout"]


def _seed_words(seed: Sequence[int]) -> np.ndarray:
    """The uint32 words NumPy's ``SeedSequence(seed)`` mixes: each non-negative int as its words,
    lowest first, 0 as one word (``numpy.random.bit_generator._coerce_to_uint32_array``)."""
    words = []
    for v in seed:
        v = int(v)
        if v < 0:
            raise ValueError(f"dropout seed {tuple(seed)}: expected non-negative integers")
        words.append(v & 0xFFFFFFFF)
        while v > 0xFFFFFFFF:
            v >>= 32
            words.append(v & 0xFFFFFFFF)
    return np.array(words, np.uint32)


class Dropout(Module):
    """``y = x * m / (1 - p)``, ``m ~ Bernoulli(1 - p)`` element-wise, in training mode only.

    Inverted dropout (Srivastava et al. 2014; ``torch.nn.Dropout``): in evaluation mode and for
    ``p = 0`` it is the identity. Unlike torch, a new Dropout starts in evaluation mode
    (``training = False``) even inside a model in training mode, so a freshly built model,
    calibration and the int8 model never drop anything unless asked: :func:`set_dropout` (or
    ``model.train()`` / ``model.eval()``, which set ``training`` on every module) switches it.

    The mask is a pure function of ``(seed, stream)``: ``numpy.random.default_rng([*seed,
    stream]).random(x.shape, dtype) >= p``, where ``seed`` is set by :func:`set_dropout` (the
    main job passes ``(run seed, phase, step)``) and ``stream`` numbers the dropout layers of a
    model. A resumed run therefore draws the same masks without any saved RNG state, and
    repeating a forward with the same seed repeats the mask (finite differences work). One
    compiled pass (:func:`nbqat.kernels.dropout_cpu.dropout_forward`) seeds, draws NumPy's stream
    and applies the mask: bit for bit NumPy's mask, in 2-3x less time.

    Parameters
    ----------
    p : float
        The drop probability, ``0 <= p < 1``.

    Attributes
    ----------
    training : bool
        Whether masks are applied.
    seed : tuple of int
        The mask seed (set by :func:`set_dropout`).
    stream : int
        This layer's index among the model's dropout layers, in module order (set by
        :class:`~nbqat.nn.ParameterBuffer`, ``model.train()`` and :func:`set_dropout`, through
        :meth:`Module.number_streams <nbqat.nn.Module.number_streams>`).
    mask : ndarray or None
        After a training-mode forward: the scaled mask ``m / (1 - p)`` (x's shape and dtype).
    rows : (global_rows, start, stop) or None
        Data-parallel runs: ``x`` holds rows ``start:stop`` of a global batch of
        ``global_rows``; the mask is drawn for the global batch's shape and sliced, so each
        rank drops what a single process would (a leading axis of ``m`` rows per batch row
        keeps its ``m``-row blocks).

    Raises
    ------
    ValueError
        When ``p`` is not in [0, 1).
    """

    DRAWS_STREAM = True

    def __init__(self, p: float) -> None:
        super().__init__()
        p = float(p)
        if not 0.0 <= p < 1.0:
            raise ValueError(f"dropout probability must be in [0, 1), got {p!r}")
        self.p = p
        self.training = False
        self.seed: tuple[int, ...] = (0,)
        self.stream = 0
        self.mask: np.ndarray | None = None
        self.rows: tuple[int, int, int] | None = None
        self._seen = False

    def active(self) -> bool:
        """True when a forward applies a mask (training mode and ``p > 0``)."""
        return self.training and self.p > 0.0

    def forward(self, x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        """``x * mask`` in training mode (a new array), ``x`` itself otherwise.

        Parameters
        ----------
        x : ndarray float32 or float64
            Any shape.
        out : ndarray, optional
            A C-contiguous array of ``x``'s shape and dtype for the result (training mode);
            in evaluation mode ``x`` is copied into it.

        Returns
        -------
        ndarray
            Shape and dtype of ``x`` (``out`` when given).

        Raises
        ------
        TypeError
            In training mode, ``x`` neither float32 nor float64; ``out`` not an array of
            ``x``'s dtype.
        ValueError
            In training mode, a negative number in ``seed`` (NumPy's SeedSequence's rule);
            ``out`` not of ``x``'s shape, read-only or not C-contiguous.
        """
        if out is not None:  # the kernel writes x.size values through a flat view of out
            V.check_out(out, np.shape(x), np.asarray(x).dtype, "Dropout out", contiguous=True)
        self._seen = True
        if not self.active():
            self._cache = None
            if out is None:
                return x
            out[...] = x
            return out
        skip = 0  # uniforms of the rows before this rank's
        if self.rows is not None and x.ndim and self.rows[2] > self.rows[1]:
            g, a, b = self.rows
            m, rem = divmod(x.shape[0], b - a)
            if rem == 0:  # the global batch's mask, this rank's rows
                skip = a * m * (x.size // max(1, x.shape[0]))
        if x.dtype not in (np.float32, np.float64):
            raise TypeError(f"Dropout: x must be float32 or float64, got {x.dtype}")
        T = x.dtype.type
        p = T(self.p)
        entropy = _seed_words((*self.seed, self.stream))
        xf = np.ascontiguousarray(x).reshape(-1)
        y = np.empty(x.shape, x.dtype) if out is None else out
        self.mask = np.empty(x.shape, x.dtype)
        dropout_forward(xf, y.reshape(-1), self.mask.reshape(-1), p, T(1.0) / (T(1.0) - p),
                        entropy, skip)  # fmt: skip
        self._cache = self.mask
        return y

    def backward(self, dy: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        """``dy * mask`` (the mask of the last forward), ``dy`` in evaluation mode.

        Parameters
        ----------
        dy : ndarray
            Gradient w.r.t. the last forward's output (its shape).
        out : ndarray, optional
            An array of ``dy``'s shape for the result (``out=dy`` works in place).

        Returns
        -------
        ndarray
            Gradient w.r.t. the input (``out`` when given).

        Raises
        ------
        RuntimeError
            Before any forward.
        ValueError
            After a masking forward, ``dy`` not of its shape (NumPy broadcast a (C,) or
            (1, C) ``dy`` against the mask into a gradient of the mask's shape).
        """
        if not self._seen:
            raise RuntimeError("Dropout.backward called before forward")
        m = self._cache
        if m is not None and np.shape(dy) != m.shape:
            raise ValueError(
                f"Dropout.backward: dy must have shape {m.shape} (the last forward's), got "
                f"{np.shape(dy)}"
            )
        if out is None:
            return dy if m is None else dy * m
        if m is None:
            out[...] = dy
            return out
        return np.multiply(dy, m, out=out)


def set_dropout(model: Any, training: bool, seed: Sequence[int] | None = None) -> int:
    """Switch every :class:`Dropout` of ``model`` to training or evaluation mode.

    Parameters
    ----------
    model : Module
    training : bool
    seed : sequence of int, optional
        The mask seed of the next forwards (e.g. ``(run_seed, phase, step)``); unchanged when
        None.

    Returns
    -------
    int
        The number of dropout layers.
    """
    on = bool(training)
    seed_t = None if seed is None else tuple(int(s) for s in seed)
    layers = model.modules_of_type(Dropout)  # module order: number_streams's numbering
    for i, mod in enumerate(layers):
        mod.training, mod.stream = on, i
        if seed_t is not None:
            mod.seed = seed_t
    return len(layers)


@contextmanager
def _dropout_attribute(model: Any, name: str, value: Any) -> Iterator[None]:
    """Within the block, every :class:`Dropout` of ``model`` (a Module; anything else holds
    none) has ``name`` set to ``value``; the previous values come back after it."""
    layers = model.modules_of_type(Dropout) if isinstance(model, Module) else ()
    saved = [getattr(mod, name) for mod in layers]
    try:
        for mod in layers:
            setattr(mod, name, value)
        yield
    finally:
        for mod, v in zip(layers, saved):
            setattr(mod, name, v)


def global_masks(model: Any, rows: tuple[int, int, int] | None) -> AbstractContextManager:
    """Within the block, draw the masks of ``model``'s dropout layers for a global batch and
    keep this rank's rows (:attr:`Dropout.rows`); the previous ``rows`` come back after it.

    Parameters
    ----------
    model : Module or QAT model
        The module tree (a QAT model's ``model``) holding the dropout layers.
    rows : (global_rows, start, stop) or None
        None changes nothing (one process).

    Returns
    -------
    context manager
    """
    if rows is None:
        return nullcontext()
    tree = model if isinstance(model, Module) else getattr(model, "model", None)
    return _dropout_attribute(tree, "rows", rows)


def dropout_off(model: Any) -> AbstractContextManager:
    """Within the block, every :class:`Dropout` of ``model`` is the identity (evaluation);
    their ``training`` flags come back after it.

    Parameters
    ----------
    model : Module

    Returns
    -------
    context manager
    """
    return _dropout_attribute(model, "training", False)
