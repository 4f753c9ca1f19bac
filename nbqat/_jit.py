"""Shared Numba compilation settings for the CPU kernels.

Every CPU kernel in :mod:`nbqat.kernels` is compiled through :func:`cpu_kernel`, so that all of
them share the same options: ``cache=True`` (a second process loads the machine code from
``__pycache__`` instead of compiling again), ``nogil=True`` and, where a kernel opts in, the
explicit fastmath set :data:`FASTMATH`.

:data:`FASTMATH` never contains ``nnan`` or ``ninf``: those flags let LLVM delete NaN and Inf
checks, which nbqat's semantics depend on. Kernels on the rounding path (fake quantization) use
no fastmath at all.
"""

from __future__ import annotations

from typing import Any, Callable

from numba import njit

#: The fastmath flags nbqat allows (STUMPY's set): never ``nnan``/``ninf``.
FASTMATH = frozenset({"nsz", "arcp", "contract", "afn", "reassoc"})


def cpu_kernel(
    *, parallel: bool = True, fastmath: bool = False, **options: Any
) -> Callable[[Callable[..., Any]], Any]:
    """Decorator factory for nbqat's CPU kernels.

    Parameters
    ----------
    parallel : bool, default True
        Compile with ``parallel=True`` so that ``numba.prange`` loops run on all threads.
    fastmath : bool, default False
        Use :data:`FASTMATH` (reductions only; never on a rounding path).
    **options
        Further keyword arguments passed to :func:`numba.njit`.

    Returns
    -------
    callable
        A decorator that compiles the function lazily on its first call.
    """
    return njit(
        parallel=parallel,
        cache=True,
        nogil=True,
        fastmath=set(FASTMATH) if fastmath else False,
        **options,
    )
