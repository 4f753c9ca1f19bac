"""Test-suite set-up.

* ``NUMBA_ENABLE_CUDASIM=1`` is set before numba is imported, so every ``@cuda.jit`` kernel runs
  on the CUDA simulator on GPU-less machines (CI). Export ``NUMBA_ENABLE_CUDASIM=0`` to run the
  same tests on a real GPU.
* The ``torch`` fixture gives the PyTorch oracle. Where torch is not installed the oracle tests
  are skipped, except when ``CI`` or ``NBQAT_REQUIRE_TORCH`` is set: then a missing torch is an
  error, so a skipped oracle can never count as a pass in CI.
* Every simulated kernel launch is recorded (:mod:`cuda_launches`): the signatures that
  ``test_cuda_compile.py`` compiles with the real compiler; tests marked ``run_last`` (the
  compile test) run after all others so that they see the whole session's launches.
* The ``small_cuda_blocks`` fixture patches the CUDA threads-per-block to a tiny value so that
  partial blocks and multi-block reductions are exercised.
"""

from __future__ import annotations

import os

os.environ.setdefault("NUMBA_ENABLE_CUDASIM", "1")

import warnings  # noqa: E402

import numpy as np  # noqa: E402
import pytest  # noqa: E402
from numba.core.errors import NumbaPerformanceWarning  # noqa: E402

warnings.simplefilter("ignore", NumbaPerformanceWarning)

import cuda_launches  # noqa: E402

cuda_launches.install()


def pytest_configure(config):
    config.addinivalue_line("markers", "run_last: run after every other test of the session")


def pytest_collection_modifyitems(config, items):
    items.sort(key=lambda item: item.get_closest_marker("run_last") is not None)  # stable


def pytest_sessionfinish(session, exitstatus):
    cuda_launches.finish()


def _torch_required() -> bool:
    return bool(os.environ.get("CI") or os.environ.get("NBQAT_REQUIRE_TORCH"))


@pytest.fixture(scope="session")
def torch():
    """PyTorch, the test oracle (never imported by nbqat itself)."""
    try:
        import torch as _torch
    except ImportError:
        if _torch_required():
            pytest.fail("torch is required in CI for the oracle tests: pip install torch==2.13.0")
        pytest.skip("torch is not installed (pip install torch==2.13.0)")
    _torch.set_num_threads(2)
    return _torch


@pytest.fixture(scope="session")
def cuda_sim():
    """numba.cuda through nbqat._cuda; skips (or fails in CI) when unavailable."""
    from nbqat import _cuda

    if not _cuda.cuda_available():
        if _torch_required():
            pytest.fail("numba-cuda (simulator) is required in CI: pip install numba-cuda")
        pytest.skip("numba.cuda is not available")
    return _cuda.cuda


@pytest.fixture
def small_cuda_blocks(monkeypatch):
    """Tiny CUDA blocks (4 threads, at most 3 blocks) so that partial blocks and grid-stride
    loops are exercised under the simulator."""
    from nbqat import _cuda

    monkeypatch.setattr(_cuda, "THREADS_PER_BLOCK", 4)
    monkeypatch.setattr(_cuda, "MAX_BLOCKS", 3)
    return 4


@pytest.fixture
def rng():
    """A fixed-seed NumPy generator."""
    return np.random.default_rng(12345)


@pytest.fixture
def force_parallel(monkeypatch):
    """Run every CPU kernel through its parallel build, however small the input (results must
    not depend on the thread count, so determinism tests use this)."""
    from nbqat import _jit

    monkeypatch.setattr(_jit, "PARALLEL_MIN", 0)
