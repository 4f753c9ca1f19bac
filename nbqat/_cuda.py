"""The one module of nbqat that imports :mod:`numba.cuda`.

Everything else reaches CUDA through this module, and only once a CUDA array has been seen, so
``import nbqat`` never touches the CUDA driver. The CUDA kernel modules
(``nbqat/kernels/*_cuda.py``) do ``from nbqat._cuda import cuda``.

Set ``NUMBA_ENABLE_CUDASIM=1`` before numba is first imported to run the CUDA kernels on the
CPU simulator (the test suite does this).
"""

from __future__ import annotations

from typing import Any

import numpy as np

try:  # numba-cuda (the `cuda` extra) or numba's bundled numba.cuda
    from numba import cuda
except Exception:  # pragma: no cover - depends on the installation
    cuda = None

#: Threads per block for 1-D grid-stride kernels. Tests patch it to a tiny value so that
#: partial blocks and multi-block reductions are exercised under the simulator.
THREADS_PER_BLOCK = 256
#: Upper bound on the number of blocks of a grid-stride kernel (and of reduction partials).
MAX_BLOCKS = 1024


def cuda_available() -> bool:
    """Whether a CUDA device (or the CUDA simulator) can run nbqat's kernels.

    Returns
    -------
    bool
        ``True`` when :mod:`numba.cuda` imports and reports a usable device.
    """
    if cuda is None:
        return False
    try:
        return bool(cuda.is_available())
    except Exception:  # pragma: no cover - driver errors
        return False


def is_cuda_array(x: Any) -> bool:
    """Whether ``x`` is a CUDA device array.

    Numba device arrays and any object exposing ``__cuda_array_interface__`` (CuPy, PyTorch CUDA
    tensors) count; NumPy arrays and Python scalars do not.
    """
    if isinstance(x, np.ndarray) or np.isscalar(x) or x is None:
        return False
    if hasattr(x, "__cuda_array_interface__"):
        return True
    if cuda is None:
        return False
    try:
        return bool(cuda.is_cuda_array(x))
    except Exception:  # pragma: no cover
        return False


def require_cuda(what: str = "this call") -> None:
    """Raise a RuntimeError that says CUDA is unavailable and how to fix it.

    Raises
    ------
    RuntimeError
        When no CUDA device (and no simulator) is available.
    """
    if not cuda_available():
        raise RuntimeError(
            f"{what} got a CUDA array but CUDA is not available: install the `cuda` extra "
            "(pip install 'nbqat[cuda]') on a machine with an NVIDIA GPU and driver, or pass "
            "NumPy arrays (or set NUMBA_ENABLE_CUDASIM=1 to use the simulator)."
        )


def as_device_array(x: Any) -> Any:
    """Wrap ``x`` (anything with ``__cuda_array_interface__``) as a Numba device array, no copy."""
    require_cuda()
    if cuda.is_cuda_array(x) and hasattr(x, "copy_to_host"):
        return x
    return cuda.as_cuda_array(x)


def device_empty(shape: Any, dtype: Any) -> Any:
    """Allocate an uninitialised device array."""
    require_cuda()
    return cuda.device_array(shape, dtype=dtype)


def grid_1d(n: int) -> tuple[int, int]:
    """``(blocks, threads)`` for a grid-stride loop over ``n`` elements."""
    tpb = THREADS_PER_BLOCK
    blocks = max(1, min(MAX_BLOCKS, (n + tpb - 1) // tpb))
    return blocks, tpb
