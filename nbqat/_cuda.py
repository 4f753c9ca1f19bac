"""The one module of nbqat that imports :mod:`numba.cuda`.

Everything else reaches CUDA through this module, and only once a CUDA array has been seen, so
``import nbqat`` never touches the CUDA driver. The CUDA kernel modules
(``nbqat/kernels/*_cuda.py``) do ``from nbqat._cuda import cuda``.

Set ``NUMBA_ENABLE_CUDASIM=1`` before numba is first imported to run the CUDA kernels on the
CPU simulator (the test suite does this).
"""

from __future__ import annotations

import functools
import types
from typing import Any

import numpy as np

_UNSET = object()
_cuda_module: Any = _UNSET


def _load() -> Any:
    """Import :mod:`numba.cuda` on first use (``None`` when it cannot be imported)."""
    global _cuda_module
    if _cuda_module is _UNSET:
        try:  # numba-cuda (the `cuda` extra) or numba's bundled numba.cuda
            from numba import cuda as _c

            _cuda_module = _c
        except Exception:  # pragma: no cover - depends on the installation
            _cuda_module = None
    return _cuda_module


def __getattr__(name: str) -> Any:
    # ``from nbqat._cuda import cuda`` imports numba.cuda only now (PEP 562).
    if name == "cuda":
        return _load()
    raise AttributeError(f"module 'nbqat._cuda' has no attribute {name!r}")


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
    cuda = _load()
    if cuda is None:
        return False
    try:
        return bool(cuda.is_available())
    except Exception:  # pragma: no cover - driver errors
        return False


def is_cuda_array(x: Any) -> bool:
    """Whether ``x`` is a CUDA device array.

    Numba device arrays and any object exposing ``__cuda_array_interface__`` (CuPy, PyTorch CUDA
    tensors) count, and so do the CUDA simulator's arrays (which have ``copy_to_host`` but no
    interface); NumPy arrays, Python scalars and host array-likes (torch CPU tensors) do not.
    The one such predicate of nbqat (:mod:`nbqat._validate` re-exports it). Never imports
    :mod:`numba.cuda`.

    Parameters
    ----------
    x : object

    Returns
    -------
    bool
    """
    if x is None or isinstance(x, np.ndarray) or np.isscalar(x):
        return False
    try:
        return hasattr(x, "__cuda_array_interface__") or hasattr(x, "copy_to_host")
    except Exception:  # e.g. a torch CUDA tensor that requires grad refuses to export itself
        return getattr(x, "is_cuda", False) is True


def rint(x: Any) -> Any:  # pragma: no cover - the body runs on the simulator only
    """Round half to even, the device twin of :func:`numpy.rint` (see :func:`device_function`).

    On the CUDA simulator (which executes a kernel's Python source with NumPy) this body runs:
    ``numpy.rint``. Under the real compiler an overload registered by :func:`_register_rint`
    lowers it to libdevice ``rintf`` (float32) or ``rint`` (float64), a single
    ``cvt.rni.f32.f32`` / ``cvt.rni.f64.f64`` instruction: same bits, same dtype, no widening.
    (numba-cuda has no ``np.rint`` for device code, and the simulator's ``libdevice.rintf``
    returns None, hence the twin.)

    Parameters
    ----------
    x : float32 or float64 scalar

    Returns
    -------
    scalar of x's dtype
    """
    return np.rint(x)


#: numpy functions that CUDA device code cannot call, and their device twins: the globals of a
#: formula bound to a key are rebound to the value by :func:`device_function`.
_NUMPY_TWINS: dict[Any, Any] = {np.rint: rint}
_rint_registered = False


def _register_rint(cuda: Any) -> None:
    """Register the compiler's lowering of :func:`rint` (once; not on the simulator)."""
    global _rint_registered
    if _rint_registered or _simulator(cuda):
        return
    from numba import types as nbt
    from numba.cuda import libdevice

    try:  # numba-cuda >= 0.20 has its own typing registry
        from numba.cuda.extending import overload  # type: ignore[attr-defined]
    except ImportError:  # pragma: no cover - older numba-cuda / numba's bundled numba.cuda
        from numba.core.extending import overload

    @overload(rint, target="cuda", inline="always")
    def _rint_cuda(x):  # pragma: no cover - typed by numba-cuda
        if x == nbt.float32:
            return lambda x: libdevice.rintf(x)
        if x == nbt.float64:
            return lambda x: libdevice.rint(x)
        return None

    _rint_registered = True


def _simulator(cuda: Any) -> bool:
    """Whether ``cuda`` is Numba's CUDA simulator (``NUMBA_ENABLE_CUDASIM=1``)."""
    import numba

    return bool(getattr(numba.config, "ENABLE_CUDASIM", 0))


def device_function(func: Any, **twins: Any) -> Any:
    """Compile a CPU kernel helper's plain Python source as a CUDA device function.

    The scalar formulas are written once (e.g. :mod:`nbqat.kernels.fake_quant_formula`) and
    compiled for each target: the CPU with ``njit(inline="always")``, the GPU by this function.
    Globals of ``func`` bound to a NumPy function that device code cannot call
    (:data:`_NUMPY_TWINS`: ``rint = numpy.rint`` becomes :func:`rint`) are rebound to the device
    twin, so the formula names ``rint`` (not ``np.rint``) and keeps one source.

    Parameters
    ----------
    func : callable
        A Numba CPU dispatcher (its ``.py_func`` is compiled) or a plain Python function; it may
        use only what CUDA kernels may use (NumPy scalar arithmetic, ``rint`` bound to
        ``numpy.rint`` ...).
    **twins
        Global names of ``func`` that are other helpers, bound to their device twins (themselves
        results of this function), so helpers may call each other on both targets.

    Returns
    -------
    numba.cuda dispatcher
        ``cuda.jit(device=True, inline="always")`` of a copy of ``func`` (same code, same
        name) whose globals have ``twins`` (and the NumPy twins) substituted.
    """
    cuda = _load()
    _register_rint(cuda)
    f = getattr(func, "py_func", func)
    g = dict(f.__globals__)
    for name in f.__code__.co_names:
        value = g.get(name)
        if isinstance(value, np.ufunc) and value in _NUMPY_TWINS:
            g[name] = _NUMPY_TWINS[value]
    g.update(twins)
    h = types.FunctionType(f.__code__, g, f.__name__, f.__defaults__, f.__closure__)
    h.__qualname__ = f.__qualname__
    h.__doc__ = f.__doc__
    return cuda.jit(device=True, inline="always")(h)


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
    if hasattr(x, "copy_to_host"):
        return x
    return _load().as_cuda_array(x)


def device_empty(shape: Any, dtype: Any) -> Any:
    """Allocate an uninitialised device array."""
    require_cuda()
    return _load().device_array(shape, dtype=dtype)


def check_reduction_threads(slots: int) -> int:
    """:data:`THREADS_PER_BLOCK`, checked against a reduction's ``slots`` of shared memory per
    block (ValueError when a test or user set it larger)."""
    tpb = THREADS_PER_BLOCK
    if tpb > slots:
        raise ValueError(f"THREADS_PER_BLOCK must be <= {slots} for reductions, got {tpb}")
    return tpb


def grid_1d(n: int) -> tuple[int, int]:
    """``(blocks, threads)`` for a grid-stride loop over ``n`` elements."""
    tpb = THREADS_PER_BLOCK
    blocks = max(1, min(MAX_BLOCKS, (n + tpb - 1) // tpb))
    return blocks, tpb


@functools.cache
def device_scalar_helpers() -> dict[str, Any]:
    """Device twins of the per-target helpers of :mod:`nbqat.kernels.lowbit_formula`.

    Returns
    -------
    dict
        ``f32_bits`` (float32 -> its uint32 bits: libdevice ``float_as_int``), ``bits_f32``
        (the inverse: ``int_as_float``) and ``mul_rn`` (a float32 product never contracted into
        an FMA: ``fmul_rn``), compiled with ``cuda.jit(device=True, inline="always")``; pass
        them to :func:`device_function` as twins. Under the simulator (whose libdevice is a
        stub) they are NumPy equivalents.
    """
    c = _load()
    import numba

    if getattr(numba.config, "ENABLE_CUDASIM", 0):

        def f32_bits(v):  # pragma: no cover - runs under the simulator
            return np.float32(v).view(np.uint32)

        def bits_f32(u):  # pragma: no cover
            return np.uint32(u).view(np.float32)

        def mul_rn(a, b):  # pragma: no cover
            return a * b

    else:  # pragma: no cover - needs the real CUDA target
        from numba.cuda import libdevice

        def f32_bits(v):
            return np.uint32(libdevice.float_as_int(v))

        def bits_f32(u):
            return libdevice.int_as_float(np.int32(u))

        def mul_rn(a, b):
            return libdevice.fmul_rn(a, b)

    jit = c.jit(device=True, inline="always")
    return {"f32_bits": jit(f32_bits), "bits_f32": jit(bits_f32), "mul_rn": jit(mul_rn)}


def device_span(x: Any) -> tuple[int, int]:
    """The byte range ``[lo, hi)`` that a CUDA array's elements span (``lo == hi`` when
    empty); the simulator's arrays, which have no ``__cuda_array_interface__``, by their host
    buffer."""
    if type(x).__name__ == "FakeCUDAArray":
        a = x._ary
        lo, shape, strides, item = a.__array_interface__["data"][0], a.shape, a.strides, a.itemsize
    else:
        cai = x.__cuda_array_interface__
        lo, shape, strides = cai["data"][0], tuple(cai["shape"]), cai.get("strides")
        item = np.dtype(cai["typestr"]).itemsize
        strides = strides or tuple(int(np.prod(shape[k + 1 :])) * item for k in range(len(shape)))
    if 0 in shape:
        return int(lo), int(lo)
    low = sum(min(0, (n - 1) * st) for n, st in zip(shape, strides))
    high = sum(max(0, (n - 1) * st) for n, st in zip(shape, strides))
    return int(lo) + low, int(lo) + high + item


def shares_bytes(a: Any, b: Any) -> bool:
    """Whether the byte ranges of two CUDA arrays intersect (empty arrays share none)."""
    (a0, a1), (b0, b1) = device_span(a), device_span(b)
    return a0 < b1 and b0 < a1 and a0 < a1 and b0 < b1


def unaliased(src: Any, *written: Any) -> Any:
    """``src``, or a device copy of it when a buffer in ``written`` (what a kernel writes while
    it reads ``src``, element ``i`` of each by one thread) shares bytes with it other than as
    the very same buffer: a write would then overwrite an element another thread has not read
    yet (``out=x`` itself, element for element in place, needs no copy). ``src`` and the
    ``written`` buffers are C-contiguous and flat."""
    for w in written:
        same = device_span(w) == device_span(src) and np.dtype(w.dtype) == np.dtype(src.dtype)
        if shares_bytes(src, w) and not same:
            tmp = _load().device_array(src.shape, src.dtype)
            tmp.copy_to_device(src)
            return tmp
    return src
