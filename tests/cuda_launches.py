"""The CUDA kernel launches of the test suite, recorded under the simulator (helper, not tests).

While the simulator tests run, :func:`install` wraps the simulator's kernel launch and records,
for every launch of a module-level ``@cuda.jit`` kernel of :mod:`nbqat.kernels`, the kernel and
the Numba types that the real CUDA dispatcher would give its arguments (device arrays by dtype,
dimensions and layout; Python ``int``/``float``/``bool`` as int64/float64/boolean; NumPy scalars
by their dtype). ``tests/cuda_launches.json`` holds the union over the suite: the signatures that
``tests/test_cuda_compile.py`` compiles with the real NVVM compiler. Regenerate it with::

    NBQAT_RECORD_LAUNCHES=1 python -m pytest tests/

(the compile test fails when the run launched a signature that the file lacks).
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import numpy as np

#: The committed record (sorted, one launch signature per entry).
PATH = Path(__file__).with_name("cuda_launches.json")

#: Launch signatures of this session: (``module:kernel``, (arg type, ...)).
SESSION: set[tuple[str, tuple[str, ...]]] = set()

_ARRAY = re.compile(r"array\((\w+), (\d+)d, ([CFA])\)$")


def arg_type(a: Any) -> str:
    """The Numba type (as text) the real CUDA dispatcher gives launch argument ``a``."""
    ary = getattr(a, "_ary", a)  # the simulator's FakeCUDAArray wraps a NumPy array
    if isinstance(ary, np.ndarray) and ary.ndim > 0:
        fl = ary.flags
        layout = "C" if fl.c_contiguous else ("F" if fl.f_contiguous else "A")
        return f"array({ary.dtype.name}, {ary.ndim}d, {layout})"
    if isinstance(a, (bool, np.bool_)):
        return "bool"
    if isinstance(a, int):
        return "int64"
    if isinstance(a, float):
        return "float64"
    if isinstance(a, np.generic):
        return np.dtype(type(a)).name
    raise TypeError(f"unrecorded kernel argument type {type(a).__name__}")


def numba_type(text: str) -> Any:
    """The Numba type of :func:`arg_type`'s text."""
    import numba
    from numba import types

    m = _ARRAY.match(text)
    if m:
        dt = numba.from_dtype(np.dtype(m.group(1)))
        return types.Array(dt, int(m.group(2)), m.group(3))
    return numba.from_dtype(np.dtype(text))


def data_dtype(args: tuple[str, ...]) -> str:
    """The dtype of the first float array argument (the kernel's data), else of the first
    array."""
    arrays = [_ARRAY.match(t).group(1) for t in args if _ARRAY.match(t)]
    floats = [d for d in arrays if d.startswith("float")]
    return (floats or arrays or ["-"])[0]


def load() -> set[tuple[str, tuple[str, ...]]]:
    """The committed launch signatures."""
    if not PATH.exists():
        return set()
    return {(e["kernel"], tuple(e["args"])) for e in json.loads(PATH.read_text())}


def save(sigs: set[tuple[str, tuple[str, ...]]]) -> None:
    """Write ``sigs`` as the committed record (sorted, stable diff)."""
    entries = [{"kernel": k, "args": list(a)} for k, a in sorted(sigs)]
    PATH.write_text(json.dumps(entries, indent=1) + "\n")


def install() -> bool:
    """Record every kernel launch of the simulator from now on (False when it is not on)."""
    if os.environ.get("NUMBA_ENABLE_CUDASIM") != "1":
        return False
    try:
        from numba.cuda.simulator import kernel as simk
    except ImportError:  # pragma: no cover - numba-cuda missing
        return False
    if getattr(simk.FakeCUDAKernel.__call__, "_nbqat_recording", False):
        return True
    launch = simk.FakeCUDAKernel.__call__

    def recording_call(self, *args):
        fn = self.fn
        module = getattr(fn, "__module__", "")
        if (
            not self._device
            and simk._get_kernel_context() is None
            and module.startswith("nbqat.kernels.")
        ):
            SESSION.add((f"{module}:{fn.__name__}", tuple(arg_type(a) for a in args)))
        return launch(self, *args)

    recording_call._nbqat_recording = True
    simk.FakeCUDAKernel.__call__ = recording_call
    return True


def finish() -> None:
    """With ``NBQAT_RECORD_LAUNCHES=1``: merge this session's launches into the record."""
    if os.environ.get("NBQAT_RECORD_LAUNCHES") == "1" and SESSION:
        save(load() | SESSION)
