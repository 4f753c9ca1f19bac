"""Every CUDA kernel launch of the suite compiles with the real compiler, no GPU needed.

The simulator tests record each kernel launch (:mod:`cuda_launches`; the committed union is
``tests/cuda_launches.json``). Here, in subprocesses without the simulator, numba-cuda's NVVM
compiles each recorded signature for sm_80 and sm_90 and ptxas (the ``nvidia-cuda-nvcc`` wheel
of ``numba-cuda[cu12]``) assembles it (:mod:`cuda_ptx`). The PTX audit then requires that a
float16/float32 kernel has no float64 instruction unless its module's ``FLOAT64_USE`` says why
(and no more than it states), and that the kernels whose results must equal the CPU twin's bits
(fake quantization, STE, casts) contain no contracted multiply-add. The table printed below
(kernel, dtype, f64 ops, registers, spills) is the one in ``docs/benchmarks.md``.

These tests run after all others (``run_last``) so that they also compile every launch of this
session. Where the compiler is missing they skip, or fail when ``CI`` or ``NBQAT_REQUIRE_TORCH``
is set.
"""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
from pathlib import Path

import cuda_launches
import pytest

pytestmark = pytest.mark.run_last

CCS = ("80", "90")
HERE = Path(__file__).parent
#: Kernels whose outputs the simulator tests compare bit for bit with the CPU twin's, in every
#: dtype: a contracted multiply-add (``fma``) would change their bits on a real GPU.
EXACT = ("cast_kernel", "fq_tensor_kernel", "fq_channel_kernel", "ste_backward_kernel")
F32_PATHS = ("float16", "float32")


def _required() -> bool:
    return bool(os.environ.get("CI") or os.environ.get("NBQAT_REQUIRE_TORCH"))


def _signatures() -> list[dict]:
    sigs = cuda_launches.load() | cuda_launches.SESSION
    return [{"kernel": k, "args": list(a)} for k, a in sorted(sigs)]


@pytest.fixture(scope="module")
def audit(tmp_path_factory):
    """Compile every signature for sm_80 and sm_90 (a few worker processes); the results."""
    tmp = tmp_path_factory.mktemp("ptx")
    src = tmp / "signatures.json"
    src.write_text(json.dumps(_signatures()))
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="0", NUMBA_NUM_THREADS="1")
    env["PYTHONPATH"] = os.pathsep.join([str(HERE.parent), env.get("PYTHONPATH", "")])
    workers = max(2, min(4, os.cpu_count() or 2))
    procs = []
    for w in range(workers):
        out = tmp / f"out{w}.json"
        cmd = [sys.executable, str(HERE / "cuda_ptx.py"), str(src), ",".join(CCS), str(out)]
        cmd += [str(w), str(workers)]
        procs.append((out, subprocess.Popen(cmd, env=env, stderr=subprocess.PIPE, text=True)))
    kernels, results, errors = set(), [], []
    for out, p in procs:
        _, err = p.communicate(timeout=600)
        if p.returncode == 3:
            if _required():
                pytest.fail(f"the CUDA compiler is required in CI: {err.strip()[-500:]}")
            pytest.skip(f"no CUDA compiler (pip install 'numba-cuda[cu12]'): {err[-300:]}")
        if p.returncode:
            errors.append(err[-3000:])
            continue
        data = json.loads(out.read_text())
        kernels.update(data["kernels"])
        results += data["results"]
    assert not errors, "\n".join(errors)
    return {"kernels": kernels, "results": results}


def _dtype(r: dict) -> str:
    return cuda_launches.data_dtype(tuple(r["args"]))


def _f64(r: dict) -> int:
    return sum(r["f64"].values())


def _allowance(kernel_ref: str) -> tuple[int, str] | None:
    module, name = kernel_ref.split(":")
    return getattr(importlib.import_module(module), "FLOAT64_USE", {}).get(name)


def table(results: list[dict]) -> str:
    """Markdown table: kernel, dtype, f64 ops, registers and spills (sm_80 / sm_90)."""
    rows: dict[tuple[str, str], dict[str, dict]] = {}
    for r in results:
        if r["ok"]:
            rows.setdefault((r["kernel"].split(":")[1], _dtype(r)), {})[r["cc"]] = r
    lines = [
        "| kernel | dtype | f64 ops | registers sm_80 / sm_90 | spill bytes |",
        "|---|---|---:|---:|---:|",
    ]
    for (name, dt), by_cc in sorted(rows.items()):
        f64 = max(_f64(r) for r in by_cc.values())
        regs = " / ".join(str(by_cc[c]["registers"]) if c in by_cc else "-" for c in CCS)
        spill = max(r["spill_bytes"] for r in by_cc.values())
        lines.append(f"| `{name}` | {dt} | {f64} | {regs} | {spill} |")
    return "\n".join(lines)


def test_every_launch_compiles_and_assembles(audit, capsys):
    results = audit["results"]
    assert results, "no recorded kernel launch (tests/cuda_launches.json)"
    failed = [
        f"{r['kernel']} sm_{r['cc']} {r['args']}: {r['error']}" for r in results if not r["ok"]
    ]
    with capsys.disabled():
        print(f"\nPTX audit ({len(results)} compilations; f64 ops = max over sm_80/sm_90):")
        print(table(results))
    assert not failed, "\n\n".join(failed)
    for sig in _signatures():
        done = {
            r["cc"] for r in results if r["kernel"] == sig["kernel"] and r["args"] == sig["args"]
        }
        assert done == set(CCS), (sig, done)


def test_every_kernel_is_launched_and_recorded(audit):
    recorded = {k for k, _ in cuda_launches.load()}
    missing = sorted(audit["kernels"] - recorded)
    assert audit["kernels"] and not missing, f"kernels no test launches: {missing}"
    unrecorded = sorted(cuda_launches.SESSION - cuda_launches.load())
    assert not unrecorded, (
        "this run launched kernel signatures missing from tests/cuda_launches.json; "
        f"record them with NBQAT_RECORD_LAUNCHES=1 python -m pytest tests/: {unrecorded}"
    )


def test_float32_paths_have_no_unexplained_float64(audit):
    bad = []
    for r in audit["results"]:
        if not r["ok"] or _dtype(r) not in F32_PATHS or not _f64(r):
            continue
        allowed = _allowance(r["kernel"])
        if allowed is None:
            bad.append(f"{r['kernel']} ({_dtype(r)}, sm_{r['cc']}): undocumented f64 {r['f64']}")
        elif _f64(r) > allowed[0]:
            bad.append(
                f"{r['kernel']} ({_dtype(r)}): {_f64(r)} f64 ops > {allowed[0]} ({r['f64']})"
            )
    assert not bad, "\n".join(bad)


def test_exact_kernels_have_no_contracted_fma(audit):
    bad = [
        f"{r['kernel']} {r['args'][:2]} sm_{r['cc']}: {r['fma']} fma"
        for r in audit["results"]
        if r["ok"] and r["fma"] and r["kernel"].split(":")[1] in EXACT
    ]
    assert not bad, "\n".join(bad)


def test_audit_counts_float64_instructions():
    """The counter itself (it must be able to fail): arithmetic and conversions count, moves,
    loads and stores do not."""
    from cuda_ptx import f64_ops

    ptx = """
        ld.global.f64 %fd1, [%rd1];
        add.f64 %fd2, %fd1, %fd1;
        @%p1 fma.rn.f64 %fd3, %fd2, %fd2, %fd1;
        cvt.f64.f32 %fd4, %f1;
        mov.f64 %fd5, %fd4;
        add.f32 %f2, %f1, %f1;
        st.global.f64 [%rd2], %fd3;
    """
    assert f64_ops(ptx) == {"add.f64": 1, "fma.rn.f64": 1, "cvt.f64.f32": 1}
