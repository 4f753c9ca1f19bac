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

import ast
import functools
import hashlib
import importlib.util
import os
import sys
import types
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import numba
from numba.core import caching as _caching
from numba.core.registry import CPUDispatcher

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
        Further target options, as :func:`numba.njit` takes them (``inline``, ...).

    Returns
    -------
    callable
        A decorator that compiles the function lazily on its first call.
    """
    targetoptions = {
        "nopython": True,
        "boundscheck": None,
        "parallel": parallel,
        "nogil": True,
        "fastmath": set(FASTMATH) if fastmath else False,
        **options,
    }

    def decorate(func: Callable[..., Any]) -> Any:
        if getattr(numba.config, "DISABLE_JIT", False):  # as numba.njit: the plain function
            return func
        disp = _SourceClosureDispatcher(func, targetoptions=dict(targetoptions))
        disp.enable_caching()  # cache=True, with the cache of SourceClosureCache
        return disp

    return decorate


def renamed(f: Callable[..., Any], name: str) -> Callable[..., Any]:
    """A copy of the plain function ``f`` under the name (and qualname) ``name``, sharing its
    code, globals, defaults and closure: the way to compile one kernel twice with other options
    (``cpu_kernel(parallel=False)(renamed(f, "f_serial"))``), since Numba's on-disk cache is
    keyed by qualname.

    Parameters
    ----------
    f : function
    name : str

    Returns
    -------
    function
    """
    g = types.FunctionType(f.__code__, f.__globals__, name, f.__defaults__, f.__closure__)
    g.__qualname__ = name
    g.__doc__ = f.__doc__
    return g


# ---------------------------------------------------------------------------- on-disk cache keys
def _module_files() -> dict[str, str]:
    """Absolute source path -> module name, for every imported module."""
    out = {}
    for name, mod in list(sys.modules.items()):
        file = getattr(mod, "__file__", None)
        if file and file.endswith(".py"):
            out[os.path.abspath(file)] = name
    return out


def _imports(path: str, module: str) -> frozenset[str]:
    """Names of the modules (and of the names imported from them) that ``path`` imports.

    Parsed once per file version (keyed on its modification time and size): every kernel's
    :func:`source_closure` walks the same package files, and parsing them again for each of the
    ~100 kernels took most of ``import nbqat`` (1.5-2 s of it under cProfile).
    """
    st = os.stat(path)
    return _parsed_imports(path, module, st.st_mtime_ns, st.st_size)


@functools.cache
def _parsed_imports(path: str, module: str, mtime_ns: int, size: int) -> frozenset[str]:
    with open(path, "rb") as fh:
        tree = ast.parse(fh.read(), path)
    is_pkg = os.path.basename(path) == "__init__.py"
    parent = module if is_pkg else module.rpartition(".")[0]
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = importlib.util.resolve_name("." * node.level + base, parent)
            names.add(base)
            names.update(f"{base}.{a.name}" for a in node.names)  # submodules imported by name
    return frozenset(names)


def source_closure(path: str) -> list[str]:
    """The source files a kernel file's machine code can depend on.

    Parameters
    ----------
    path : str
        A Python source file of an imported package module (e.g. ``nbqat/kernels/qat_cpu.py``).

    Returns
    -------
    list of str
        Sorted absolute paths: ``path`` and, transitively, every module of the same top-level
        package that it imports (constants such as ``nbqat._validate.QUANT_BOUND`` and
        ``@njit`` helpers of other kernel files are compiled into the caller's machine code).
    """
    path = os.path.abspath(path)
    by_path = _module_files()
    if path not in by_path:
        return [path]
    package = by_path[path].split(".")[0]
    by_name = {name: file for file, name in by_path.items()}
    seen, todo = {path}, [path]
    while todo:
        file = todo.pop()
        for name in _imports(file, by_path[file]):
            dep = by_name.get(name)
            if dep and dep not in seen and (name == package or name.startswith(package + ".")):
                seen.add(dep)
                todo.append(dep)
    return sorted(seen)


@functools.cache
def _closure_stamp(stamps: tuple[tuple[str, int, int], ...]) -> str:
    h = hashlib.sha256()
    for file, _, _ in stamps:
        h.update(file.encode())
        with open(file, "rb") as fh:
            h.update(fh.read())
    return h.hexdigest()


class _ClosureStampMixin:
    """Numba cache locator whose freshness stamp hashes the kernel's whole source closure.

    Numba keys a cached function on its own file only, so an edit of a constant or a jitted
    helper in another module would leave a stale kernel in ``__pycache__``; this stamp changes
    whenever any file of :func:`source_closure` changes (content hash).
    """

    _py_file: str

    def get_source_stamp(self) -> Any:
        path = getattr(self, "_py_file", None)
        if not path or not os.path.isfile(path):  # zipped or interactive code: numba's own
            return super().get_source_stamp()  # type: ignore[misc]
        files = source_closure(path)
        stamps = []
        for f in files:
            st = os.stat(f)
            stamps.append((f, st.st_mtime_ns, st.st_size))
        return _closure_stamp(tuple(stamps))


class _SourceClosureCacheImpl(_caching.CompileResultCacheImpl):
    _locator_classes: list[Any] = [
        type("Closure" + c.__name__, (_ClosureStampMixin, c), {})
        for c in _caching.CompileResultCacheImpl._locator_classes
    ]


class SourceClosureCache(_caching.FunctionCache):
    """Numba's per-function on-disk cache, invalidated when any file the kernel imports from
    its own package changes (see :func:`source_closure`); used by every :func:`cpu_kernel`."""

    _impl_class = _SourceClosureCacheImpl


class _SourceClosureDispatcher(CPUDispatcher):
    """What ``numba.njit(cache=True, ...)`` builds, with :class:`SourceClosureCache` as its
    on-disk cache: numba's own hook for the cache (``enable_caching``) overridden in a
    subclass, so nothing outside the dispatcher writes its private state."""

    def enable_caching(self) -> None:
        self._cache = SourceClosureCache(self.py_func)


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
