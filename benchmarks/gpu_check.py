"""The GPU check: the CUDA tests on the device (no simulator) and the CUDA benchmarks.

Run on a machine with an NVIDIA GPU, through ``benchmarks/gpu_check.sh`` (one command)::

    benchmarks/gpu_check.sh              # tests + benchmarks, one summary table
    benchmarks/gpu_check.sh --dry-run    # the plan only: touches no GPU (tested in CI)

It uses what is installed there (numba-cuda of any CUDA major, torch if present, pytest if
present) and this checkout's source; nothing is downloaded. The benchmarks time nbqat's CUDA
fake quantization (per tensor, per channel), min/max observer, gradient-norm clipping and Adam
step on float32 device arrays: GB/s moved, the fraction of the device's memory roof (the median
device-to-device copy of the same bytes, measured in the same run) and, where torch has CUDA,
the ratio of torch's time to nbqat's (above 1: nbqat is faster). Sized to finish in well under
4 minutes on one H200 (``--mib`` sets the float32 array size).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent

#: The CUDA test modules, run with NUMBA_ENABLE_CUDASIM=0 (on the device).
CUDA_TESTS = (
    "tests/test_fake_quant_cuda.py",
    "tests/test_cuda_dtypes.py",
    "tests/test_observers_cuda.py",
    "tests/test_histogram_cuda.py",
    "tests/test_clip_cuda.py",
    "tests/test_optim_cuda.py",
    "tests/test_lowbit_cuda.py",
)
#: Benchmarks: name -> bytes moved per float32 element.
BENCHES = {
    "fake_quant per tensor": 8,
    "fake_quant per channel": 8,
    "MinMaxObserver": 4,
    "clip_grad_norm_": 12,
    "Adam step": 28,
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line of the GPU check.

    Parameters
    ----------
    argv : list of str, optional
        Arguments (default ``sys.argv[1:]``).

    Returns
    -------
    argparse.Namespace
        ``dry_run``, ``mib``, ``repeat``, ``channels``, ``tests``, ``benchmarks``,
        ``test_timeout``.
    """
    p = argparse.ArgumentParser(prog="gpu_check", description=__doc__.splitlines()[0])
    p.add_argument("--dry-run", action="store_true", help="print the plan; touch no GPU")
    p.add_argument("--mib", type=int, default=256, help="float32 array size in MiB (256)")
    p.add_argument("--repeat", type=int, default=20, help="timed repetitions (median)")
    p.add_argument("--channels", type=int, default=256, help="channels of the per-channel case")
    p.add_argument("--no-tests", dest="tests", action="store_false", help="skip the tests")
    p.add_argument(
        "--no-benchmarks", dest="benchmarks", action="store_false", help="skip the benchmarks"
    )
    p.add_argument("--test-timeout", type=int, default=150, help="seconds for the tests (150)")
    a = p.parse_args(argv)
    if a.mib < 1 or a.repeat < 1 or a.channels < 1 or a.test_timeout < 1:
        p.error("--mib, --repeat, --channels and --test-timeout must be positive")
    return a


def test_command() -> list[str]:
    """pytest on the CUDA test modules (``-o addopts=`` drops pytest-benchmark's option)."""
    return [sys.executable, "-m", "pytest", "-q", "-x", "-o", "addopts=-ra", *CUDA_TESTS]


def run_tests(timeout: int) -> tuple[str, str]:
    """(status, detail) of the CUDA tests on the device."""
    if importlib.util.find_spec("pytest") is None:
        return "not run", "pytest is not installed"
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="0")
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    t0 = time.perf_counter()
    try:
        r = subprocess.run(test_command(), cwd=ROOT, env=env, capture_output=True, text=True,
                           timeout=timeout, check=False)  # fmt: skip
    except subprocess.TimeoutExpired:
        return "TIMEOUT", f"over {timeout} s"
    tail = (r.stdout + r.stderr).strip().splitlines()
    print("\n".join(tail[-25:]))
    last = tail[-1] if tail else ""
    status = "passed" if r.returncode == 0 else f"FAILED (rc {r.returncode})"
    return status, f"{last} [{time.perf_counter() - t0:.0f} s]"


def _median(fn: Callable[[], Any], sync: Callable[[], Any], repeat: int) -> float:
    """Median seconds of ``fn()`` (synchronised) after two warm-up calls (JIT compile)."""
    fn()
    fn()
    sync()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


def _torch_cuda() -> Any:
    try:
        import torch
    except ImportError:
        return None
    return torch if torch.cuda.is_available() else None


def _nbqat_cases(cuda: Any, x: np.ndarray, channels: int) -> dict[str, Callable[[], Any]]:
    import nbqat
    from nbqat.quantization import fake_quant as F

    n = x.size
    dx, dout = cuda.to_device(x), cuda.device_array(n, np.float32)
    d2 = dx.reshape(n // channels, channels)
    out2 = dout.reshape(n // channels, channels)
    sc = np.linspace(0.01, 0.1, channels).astype(np.float32)
    zp = np.zeros(channels, np.int32)
    obs = nbqat.MinMaxObserver()
    grad = cuda.to_device(x)
    params = cuda.to_device(np.zeros(n, np.float32))
    adam = nbqat.Adam(params, lr=1e-3)
    return {
        "fake_quant per tensor": lambda: F.fake_quantize_per_tensor_affine(
            dx, 0.05, 3, -128, 127, out=dout
        ),
        "fake_quant per channel": lambda: F.fake_quantize_per_channel_affine(
            d2, sc, zp, 1, -128, 127, out=out2
        ),
        "MinMaxObserver": lambda: obs(dx),
        "clip_grad_norm_": lambda: nbqat.clip_grad_norm_([grad], 1e30),
        "Adam step": lambda: adam.step(dx),
    }


def _torch_cases(torch: Any, x: np.ndarray, channels: int) -> dict[str, Callable[[], Any]]:
    n = x.size
    tx = torch.from_numpy(x).cuda()
    t2 = tx.view(n // channels, channels)
    sc = torch.linspace(0.01, 0.1, channels, device="cuda")
    zp = torch.zeros(channels, dtype=torch.int32, device="cuda")
    p = torch.nn.Parameter(torch.zeros(n, device="cuda"))
    p.grad = tx.clone()
    adam = torch.optim.Adam([p], lr=1e-3, fused=True)
    return {
        "fake_quant per tensor": lambda: torch.fake_quantize_per_tensor_affine(
            tx, 0.05, 3, -128, 127
        ),
        "fake_quant per channel": lambda: torch.fake_quantize_per_channel_affine(
            t2, sc, zp, 1, -128, 127
        ),
        "MinMaxObserver": lambda: torch.aminmax(tx),
        "clip_grad_norm_": lambda: torch.nn.utils.clip_grad_norm_([p], 1e30),
        "Adam step": adam.step,
    }


def run_benchmarks(args: argparse.Namespace) -> list[tuple[str, str, str, str, str]]:
    """Rows (name, ms, GB/s, % of roof, torch time / nbqat time)."""
    from nbqat._cuda import cuda, cuda_available

    if not cuda_available():
        return [("benchmarks", "-", "-", "-", "no CUDA device")]
    n = args.mib * 2**20 // 4 // args.channels * args.channels
    x = (np.random.default_rng(0).standard_normal(n) * 2).astype(np.float32)
    src, dst = cuda.to_device(x), cuda.device_array(n, np.float32)
    roof_s = _median(lambda: dst.copy_to_device(src), cuda.synchronize, args.repeat)
    roof_gbs = 2 * 4 * n / roof_s / 1e9  # bytes moved by the copy: read + write
    torch = _torch_cuda()
    mine = _nbqat_cases(cuda, x, args.channels)
    theirs = _torch_cases(torch, x, args.channels) if torch is not None else {}
    rows = [("device copy (roof)", f"{roof_s * 1e3:.3f}", f"{roof_gbs:.0f}", "100%", "-")]
    for name, per_elem in BENCHES.items():
        t = _median(mine[name], cuda.synchronize, args.repeat)
        gbs = per_elem * n / t / 1e9
        ratio = "-"
        if name in theirs:
            tt = _median(theirs[name], torch.cuda.synchronize, args.repeat)
            ratio = f"{tt / t:.2f}"
        rows.append((name, f"{t * 1e3:.3f}", f"{gbs:.0f}", f"{gbs / roof_gbs:.0%}", ratio))
    return rows


def device_line() -> str:
    """The device, numba-cuda and torch versions (one line)."""
    import numba

    from nbqat._cuda import cuda, cuda_available

    if not cuda_available():
        return f"no CUDA device (numba {numba.__version__})"
    dev = cuda.get_current_device()
    name = getattr(dev, "name", "CUDA device")
    name = name.decode() if isinstance(name, bytes) else str(name)
    torch = _torch_cuda()
    tv = torch.__version__ if torch is not None else "no torch CUDA"
    return (
        f"{name}, sm_{''.join(map(str, dev.compute_capability))}, numba {numba.__version__}, {tv}"
    )


def table(rows: list[tuple[str, ...]], header: tuple[str, ...]) -> str:
    """A fixed-width text table."""
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    return "\n".join([fmt.format(*header), fmt.format(*("-" * w for w in widths))]
                     + [fmt.format(*r) for r in rows])  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    """Run the check; 0 when the tests passed (or were not asked for)."""
    args = parse_args(argv)
    n = args.mib * 2**20 // 4
    if args.dry_run:
        print("gpu_check plan (dry run, no GPU touched):")
        if args.tests:
            print("  tests: NUMBA_ENABLE_CUDASIM=0 " + " ".join(test_command()[1:]))
        if args.benchmarks:
            print(f"  benchmarks: {', '.join(BENCHES)} on {n} float32 ({args.mib} MiB), "
                  f"{args.channels} channels, median of {args.repeat}")  # fmt: skip
        return 0
    if os.environ.get("NUMBA_ENABLE_CUDASIM", "0") not in ("", "0"):
        print("gpu_check: unset NUMBA_ENABLE_CUDASIM (it runs on the device)", file=sys.stderr)
        return 2
    status, detail = run_tests(args.test_timeout) if args.tests else ("not run", "--no-tests")
    rows = run_benchmarks(args) if args.benchmarks else []
    print("\n" + device_line())
    print(table([("CUDA tests (no simulator)", status, detail)], ("check", "status", "detail")))
    if rows:
        print()
        print(table(rows, ("benchmark (float32)", "ms", "GB/s", "roof", "torch/nbqat")))
    return 0 if status in ("passed", "not run") else 1


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    sys.exit(main())
