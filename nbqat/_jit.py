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

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import numba
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


#: Below this many elements (4 MiB of float32) the CPU kernels run on one thread: one pass over
#: fewer elements takes well under a millisecond, while waking a sleeping worker thread can
#: cost several (measured on the 2-vCPU development VM: 4-8 ms whenever the other vCPU was idle
#: or held by OpenBLAS's spinning threads, against 25 us back to back). Every public function
#: and :class:`~nbqat.FakeQuantize` read it at call time; results never depend on the thread
#: count (fixed chunking), so tests may set it to 0 to force the parallel builds.
PARALLEL_MIN = 1 << 20


@contextmanager
def threads_for(n_elements: int) -> Iterator[None]:
    """Run the enclosed CPU kernels on one thread when ``n_elements < PARALLEL_MIN``.

    Parameters
    ----------
    n_elements : int
        How many elements the enclosed kernels touch.

    Yields
    ------
    None
        Numba's thread count is restored on exit.
    """
    old = numba.get_num_threads()
    if n_elements >= PARALLEL_MIN or old == 1:
        yield
        return
    numba.set_num_threads(1)
    try:
        yield
    finally:
        numba.set_num_threads(old)
