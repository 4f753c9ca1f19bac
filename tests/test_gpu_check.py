"""benchmarks/gpu_check.sh (run on a GPU machine): importable, its arguments parsed, its dry run
(which touches no GPU) prints the plan."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def gpu_check():
    spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "benchmarks/gpu_check.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_parse_args(gpu_check):
    a = gpu_check.parse_args([])
    assert (a.dry_run, a.mib, a.repeat, a.tests, a.benchmarks) == (False, 256, 20, True, True)
    a = gpu_check.parse_args(["--dry-run", "--mib", "8", "--no-tests", "--repeat", "3"])
    assert (a.dry_run, a.mib, a.repeat, a.tests) == (True, 8, 3, False)
    for bad in (["--mib", "0"], ["--repeat", "-1"], ["--bogus"]):
        with pytest.raises(SystemExit):
            gpu_check.parse_args(bad)


def test_plan_names_existing_tests(gpu_check):
    for path in gpu_check.CUDA_TESTS:
        assert (ROOT / path).is_file(), path
    cmd = gpu_check.test_command()
    assert cmd[1:3] == ["-m", "pytest"] and set(gpu_check.CUDA_TESTS) <= set(cmd)
    assert "fake_quant per channel" in gpu_check.BENCHES
    # every CUDA test module runs on the device (README, docs/semantics.md); the compile check
    # needs no device (test_lowbit_cuda.py was missing)
    on_sim = {f"tests/{p.name}" for p in (ROOT / "tests").glob("test_*cuda*.py")}
    assert on_sim - set(gpu_check.CUDA_TESTS) == {"tests/test_cuda_compile.py"}


def test_table(gpu_check):
    text = gpu_check.table([("a", "1.5"), ("bbb", "2")], ("name", "ms"))
    assert text.splitlines() == ["name  ms ", "----  ---", "a     1.5", "bbb   2  "]


def test_dry_run_through_the_shell_script():
    env = dict(os.environ, PYTHON=sys.executable)
    r = subprocess.run(
        ["bash", str(ROOT / "benchmarks/gpu_check.sh"), "--dry-run", "--mib", "4"],
        env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert "dry run" in r.stdout and "NUMBA_ENABLE_CUDASIM=0" in r.stdout
    assert "tests/test_fake_quant_cuda.py" in r.stdout and "1048576 float32 (4 MiB)" in r.stdout
