"""Edge cases found by trying to break the library (issue: "three robustness holes").

* Empty batches through every quantizer module: pass through, observers unchanged, backward
  returns an empty gradient and accumulates nothing.
* The int8 integer matmul with wide codes, non-zero weight zero points and large
  ``in_features``: exact (checked against Python integers) or a ValueError before computing.
* Numba's on-disk cache after an edit of a constant in another module: the kernel recompiles
  (``nbqat._jit.SourceClosureCache``), where plain ``njit(cache=True)`` runs stale code.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from fq_configs import per_channel_kwargs

import nbqat
from nbqat.nn.int8 import accumulator_dtype, qlinear

_PER_TENSOR = dict(observer=nbqat.MovingAverageMinMaxObserver, quant_min=0, quant_max=255)


@pytest.mark.parametrize("cls", [nbqat.FakeQuantize, nbqat.LearnableFakeQuantize])
@pytest.mark.parametrize(
    "kwargs, warm, empty",
    [
        (_PER_TENSOR, (2, 4), (0, 4)),
        (_PER_TENSOR, (2, 4), (0,)),
        (per_channel_kwargs(1), (2, 4), (0, 4)),
        (per_channel_kwargs(0), (4, 3), (4, 0)),
        (per_channel_kwargs(1), (2, 4, 3), (2, 4, 0)),
    ],
)
@pytest.mark.parametrize("learn", [False, True])
def test_empty_batch_passes_through(cls, kwargs, warm, empty, learn):
    fq = cls(**kwargs)
    rng = np.random.default_rng(0)
    fq(rng.standard_normal(warm).astype(np.float32))
    if learn:
        if cls is nbqat.LearnableFakeQuantize:
            fq.enable_param_learning()
        else:
            fq.disable_observer()
    before = {k: np.array(v, copy=True) for k, v in fq.state_dict().items()}
    x = np.zeros(empty, np.float32)
    y = fq(x)
    g = fq.backward(np.zeros(empty, np.float32))
    assert y.shape == empty and y.dtype == np.float32
    assert g.shape == empty and g.dtype == np.float32
    after = fq.state_dict()
    assert before.keys() == after.keys()
    for k in before:
        np.testing.assert_array_equal(before[k], after[k], err_msg=k)
    if cls is nbqat.LearnableFakeQuantize:
        assert not np.any(fq.grad_scale) and not np.any(fq.grad_zero_point)
    # and the quantizer still works on data afterwards
    x2 = rng.standard_normal(warm).astype(np.float32)
    assert np.all(np.isfinite(fq(x2)))


def _exact(xq, zx, wq, zw, mult, bias):
    """Python-integer reference of ``float32(sum (x - zx)(w - zw) * mult) + bias``."""
    xc = np.asarray(xq, dtype=object) - int(zx)
    wc = np.asarray(wq, dtype=object) - np.asarray(zw, dtype=object)[:, None]
    acc = xc.dot(wc.T)  # exact Python ints
    out = np.empty(acc.shape, np.float32)
    for idx, a in np.ndenumerate(acc):
        out[idx] = np.float32(np.float64(a) * mult[idx[1]]) + np.float32(bias[idx[1]])
    return out


@pytest.mark.parametrize(
    "case",
    [
        # 16-bit activation and weight codes: one product is up to 2**32
        dict(k=8, x=(0, 65535), zx=0, w=(-32768, 32767), zw=0),
        # uint8 weights with a non-zero zero point: |w - zw| up to 255, K beyond 65793/2
        dict(k=40000, x=(0, 255), zx=0, w=(0, 255), zw=255),
        # the default ranges (int32 is exact here and must be chosen)
        dict(k=64, x=(0, 255), zx=3, w=(-127, 127), zw=0),
    ],
)
def test_qlinear_is_exact_for_wide_codes(case):
    rng = np.random.default_rng(1)
    m, n, k = 3, 4, case["k"]
    lo, hi = case["x"]
    xq = np.full((m, k), hi, np.int64)  # worst case: every product at its extreme
    xq[1] = rng.integers(lo, hi + 1, k)
    xq[2] = lo
    wlo, whi = case["w"]
    wq = np.full((n, k), wlo, np.int64)
    wq[1] = rng.integers(wlo, whi + 1, k)
    wq[2] = whi
    zw = np.full(n, case["zw"], np.int64)
    ws = rng.uniform(1e-4, 1e-3, n).astype(np.float32)
    b = rng.standard_normal(n).astype(np.float32)
    xs = np.float32(0.01)
    got = qlinear(xq, xs, case["zx"], wq, ws, zw, b)
    mult = np.float64(xs) * ws.astype(np.float64)
    np.testing.assert_array_equal(got, _exact(xq, case["zx"], wq, zw, mult, b))


def test_accumulator_dtype_bounds():
    assert accumulator_dtype(65793, 255, 128) == np.int32  # the documented default bound
    assert accumulator_dtype(65794, 255, 128) == np.int64
    assert accumulator_dtype(1, 65535, 65535) == np.int64
    with pytest.raises(ValueError, match="int64 accumulator"):
        accumulator_dtype(2**40, 65535, 65535)


def test_int8_linear_picks_a_wide_accumulator_for_16_bit_codes():
    from nbqat.nn.int8 import Int8Linear

    rng = np.random.default_rng(2)
    w = rng.standard_normal((3, 5)).astype(np.float32)
    wfq = nbqat.FakeQuantize(
        **per_channel_kwargs(0, quant_min=-32768, quant_max=32767, dtype="qint32")
    )
    xfq = nbqat.FakeQuantize(
        observer=nbqat.MovingAverageMinMaxObserver, quant_min=0, quant_max=65535, dtype="qint32"
    )
    wfq(w)
    x = rng.uniform(-1, 1, (4, 5)).astype(np.float32)
    xfq(x)
    lin = Int8Linear(w, None, wfq, xfq, "wide")
    assert lin.accumulator_dtype == np.int64
    xq = lin.quantize_input(x)
    mult = np.float64(lin.input_scale) * lin.weight_scale.astype(np.float64)
    ref = _exact(xq, lin.input_zero_point, lin.weight_q, lin.weight_zero_point, mult, lin.bias)
    np.testing.assert_array_equal(lin.forward(x), ref)


_KERNEL = """
import numpy as np
from {jit_import}
from stalepkg.consts import K

@{decorator}
def add_k(x):
    return x + K
"""


def _run(tmp_path, code):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), *sys.path]))
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    return out.stdout.strip()


@pytest.mark.parametrize("closure_cache", [True, False])
def test_kernel_cache_notices_a_changed_constant_in_another_module(tmp_path, closure_cache):
    pkg = tmp_path / "stalepkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "consts.py").write_text("K = 1\n")
    if closure_cache:
        src = _KERNEL.format(
            jit_import="nbqat._jit import cpu_kernel", decorator="cpu_kernel(parallel=False)"
        )
    else:  # numba's own cache: the control that shows the hazard is real
        src = _KERNEL.format(jit_import="numba import njit", decorator="njit(cache=True)")
    (pkg / "kern.py").write_text(textwrap.dedent(src))
    code = "from stalepkg.kern import add_k; print(add_k(10))"
    assert _run(tmp_path, code) == "11"
    assert list((pkg / "__pycache__").glob("*.nbi")), "the kernel was not cached"
    (pkg / "consts.py").write_text("K = 2  # changed\n")
    got = _run(tmp_path, code)
    if closure_cache:
        assert got == "12"
    else:
        assert got == "11"  # stale: why nbqat keys its cache on the source closure
