"""Compile flags of the CPU kernels: ``parallel=True`` only where the kernel's own body has a
``prange`` (elsewhere Numba gains nothing and warns ``NumbaPerformanceWarning`` at compile time,
which a newcomer sees on first use; a call into another parallel kernel runs on its threads)."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import nbqat.kernels
from nbqat._jit import _SourceClosureDispatcher


def _parallel_without_prange(kernels) -> list[str]:
    return sorted(
        name
        for name, disp in kernels
        if disp.targetoptions.get("parallel") and "prange(" not in inspect.getsource(disp.py_func)
    )


def _cpu_kernels():
    for info in pkgutil.iter_modules(nbqat.kernels.__path__):
        mod = importlib.import_module(f"nbqat.kernels.{info.name}")
        for name, obj in vars(mod).items():
            if isinstance(obj, _SourceClosureDispatcher) and obj.py_func.__module__ == mod.__name__:
                yield f"{mod.__name__}.{name}", obj


def test_every_parallel_cpu_kernel_has_a_prange_of_its_own():
    kernels = list(_cpu_kernels())
    assert sum(d.targetoptions.get("parallel") for _, d in kernels) >= 20  # the walk finds them
    assert _parallel_without_prange(kernels) == []


def test_the_prange_check_can_fail():
    from nbqat._jit import cpu_kernel

    @cpu_kernel(parallel=True)
    def no_loop(x):  # pragma: no cover
        return x + 1

    @cpu_kernel(parallel=True)
    def with_loop(x):  # pragma: no cover
        for i in prange(x.size):  # noqa: F821 (never compiled here)
            x[i] += 1

    assert _parallel_without_prange([("no_loop", no_loop), ("with_loop", with_loop)]) == ["no_loop"]
