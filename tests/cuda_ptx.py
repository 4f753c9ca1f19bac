"""Compile recorded kernel launches with the real CUDA compiler, no GPU (helper, not tests).

Run as a script in a process WITHOUT the simulator (``NUMBA_ENABLE_CUDASIM=0``)::

    python tests/cuda_ptx.py SIGNATURES.json 80,90 OUT.json [START STEP]

For each ``{"kernel": "module:name", "args": [...]}`` of SIGNATURES.json (the text types of
:mod:`cuda_launches`), the kernel's Python source is compiled by numba-cuda's NVVM path
(:func:`numba.cuda.compile_ptx` with the kernel's own options) for each compute capability
(``80``, ``90``: arch ``sm_80``, ``sm_90a`` as the dispatcher picks on such a device), the PTX is
assembled by ``ptxas -v``, and OUT.json receives, per
signature, ``ok``, the error text, the float64 instruction counts of the PTX and ptxas's register
and spill report. Compiling a kernel that calls a non-inlined device function asks numba-cuda for
the current device's compute capability: with no driver, this script supplies it. Exit status
3: NVVM, libdevice or ptxas is missing.
"""

from __future__ import annotations

import importlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import types
from collections import Counter
from pathlib import Path

#: PTX opcodes that touch float64 data without computing (moves, loads, stores, declarations).
_F64_NOT_ARITH = ("ld.", "st.", "mov.", "cvta.", ".reg", ".param", ".local", ".shared")
_OPCODE = re.compile(r"^\s*(?:@!?%\w+\s+)?([a-z][\w.]*)", re.MULTILINE)
_REGS = re.compile(r"Used (\d+) registers")
_SPILL = re.compile(r"(\d+) bytes spill stores, (\d+) bytes spill loads")


def ptxas_path() -> str | None:
    """ptxas of the ``nvidia-cuda-nvcc`` wheel (``numba-cuda[cu12]``), else on ``PATH``."""
    try:
        import nvidia.cuda_nvcc as nvcc  # type: ignore[import-not-found]

        for base in list(getattr(nvcc, "__path__", [])):
            p = Path(base) / "bin" / "ptxas"
            if p.exists():
                return str(p)
    except ImportError:
        pass
    return shutil.which("ptxas")


def f64_ops(ptx: str) -> dict[str, int]:
    """Float64 arithmetic instructions of ``ptx`` by opcode (``add.f64``, ``cvt.f64.f32`` ...)."""
    ops = Counter()
    for op in _OPCODE.findall(ptx):
        if "f64" in op and not op.startswith(_F64_NOT_ARITH):
            ops[op] += 1
    return dict(ops)


def _supply_compute_capability(cc: tuple[int, int]) -> None:
    """Make numba-cuda's device-function compile path see compute capability ``cc``."""
    from numba.cuda import dispatcher

    device = types.SimpleNamespace(compute_capability=cc)
    dispatcher.get_current_device = lambda: device


def compile_one(kernel_ref: str, args: list[str], cc: tuple[int, int], ptxas: str) -> dict:
    """PTX, f64 ops and ptxas resources of one kernel signature."""
    from cuda_launches import numba_type
    from numba.cuda import compile_ptx

    module, name = kernel_ref.split(":")
    kernel = getattr(importlib.import_module(module), name)
    opts = kernel.targetoptions
    sig = tuple(numba_type(a) for a in args)
    arch = (cc[0], cc[1], "a" if cc >= (9, 0) else "")  # what the dispatcher picks on a device
    ptx, _ = compile_ptx(
        kernel.py_func, sig, cc=arch, fastmath=opts.get("fastmath", False),
        lineinfo=opts.get("lineinfo", False), debug=opts.get("debug", False),
    )  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "k.ptx"
        src.write_text(ptx)
        cubin = str(Path(tmp) / "k.cubin")
        cmd = [ptxas, f"-arch=sm_{cc[0]}{cc[1]}{arch[2]}", "-v", "-o", cubin, str(src)]
        run = subprocess.run(cmd, capture_output=True, text=True, check=False)
    report = run.stdout + run.stderr
    if run.returncode:
        raise RuntimeError(f"ptxas failed: {report.strip()[-2000:]}")
    regs = [int(r) for r in _REGS.findall(report)]
    spills = [int(a) + int(b) for a, b in _SPILL.findall(report)]
    ops = f64_ops(ptx)
    fma = sum(1 for op in _OPCODE.findall(ptx) if op.startswith("fma."))
    return {"f64": ops, "registers": max(regs, default=0), "spill_bytes": sum(spills),
            "fma": fma}  # fmt: skip


def kernels() -> list[str]:
    """``module:name`` of every ``@cuda.jit`` kernel (not device function) defined in
    ``nbqat/kernels/*_cuda.py``."""
    from numba.cuda.dispatcher import CUDADispatcher

    import nbqat.kernels as pkg

    found = []
    for path in sorted(Path(pkg.__file__).parent.glob("*_cuda.py")):
        mod = importlib.import_module(f"nbqat.kernels.{path.stem}")
        for name, obj in vars(mod).items():
            if isinstance(obj, CUDADispatcher) and not obj.targetoptions.get("device"):
                if getattr(obj.py_func, "__module__", None) == mod.__name__:
                    found.append(f"{mod.__name__}:{name}")
    return found


def _toolchain(cc: tuple[int, int]) -> str:
    """ptxas's path; exits with status 3 when NVVM, libdevice or ptxas is missing."""
    ptxas = ptxas_path()
    try:
        from numba.cuda import compile_ptx

        compile_ptx(lambda a: None, "void(float32[::1])", cc=cc)  # NVVM + libdevice load
    except Exception as exc:
        print(f"the CUDA compiler is unavailable: {type(exc).__name__}: {exc}", file=sys.stderr)
        raise SystemExit(3) from exc
    if ptxas is None:
        print("ptxas not found (pip install 'numba-cuda[cu12]')", file=sys.stderr)
        raise SystemExit(3)
    return ptxas


def main(argv: list[str]) -> int:
    """``SIGNATURES.json CC[,CC...] OUT.json [START STEP]``: compile entries START::STEP."""
    src, ccs_text, out = argv[:3]
    start, step = (int(argv[3]), int(argv[4])) if len(argv) > 3 else (0, 1)
    if os.environ.get("NUMBA_ENABLE_CUDASIM", "0") not in ("", "0"):
        raise SystemExit("cuda_ptx.py needs the real compiler: run with NUMBA_ENABLE_CUDASIM=0")
    ccs = [(int(c[:-1]), int(c[-1])) for c in ccs_text.split(",")]
    ptxas = _toolchain(ccs[0])
    results = []
    for entry in json.loads(Path(src).read_text())[start::step]:
        for cc in ccs:
            _supply_compute_capability(cc)
            res = {"kernel": entry["kernel"], "args": entry["args"], "cc": f"{cc[0]}{cc[1]}"}
            try:
                res.update(compile_one(entry["kernel"], entry["args"], cc, ptxas), ok=True)
            except Exception as exc:  # reported per signature by the test
                res.update(ok=False, error=f"{type(exc).__name__}: {exc}"[-3000:])
            results.append(res)
    Path(out).write_text(json.dumps({"kernels": kernels(), "results": results}, indent=1))
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).parent))
    sys.exit(main(sys.argv[1:]))
