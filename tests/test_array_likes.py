"""Array-likes through the public fake-quantize functions (issue 15), and the scalar formulas
written once for the CPU and the device.

* torch CPU tensors (``__array__`` and ``__dlpack__``) and objects with only ``__dlpack__`` give
  the same NumPy results as the NumPy arrays they hold (the oracle: the NumPy call, itself
  checked bit for bit against torch in tests/test_fake_quant.py, and torch here);
* a tensor that requires grad is a TypeError that says ``.detach()``, raised before anything is
  computed;
* the CUDA twins' device functions are compiled from the CPU helpers' code objects, and every
  CPU kernel's cache key covers the formula module.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

import nbqat
from nbqat import _cuda, _jit
from nbqat import _validate as V


class _DLPackOnly:
    """An array-like that exposes only ``__dlpack__`` (no ``__array__``)."""

    def __init__(self, a):
        self._a = a

    def __dlpack__(self, *args, **kwargs):
        return self._a.__dlpack__(*args, **kwargs)

    def __dlpack_device__(self):
        return self._a.__dlpack_device__()


def _x(rng, shape=(4, 6)):
    x = (rng.standard_normal(shape) * 3).astype(np.float32)
    x.flat[::5] = 0.125 * np.arange(x.flat[::5].size)  # exact ties for round-half-even
    return x


def test_torch_cpu_tensor_matches_numpy_and_torch(torch, rng):
    x = _x(rng)
    t = torch.from_numpy(x.copy())
    y = nbqat.fake_quantize_per_tensor_affine(t, 0.25, 3, -128, 127)
    assert type(y) is np.ndarray and y.dtype == np.float32
    np.testing.assert_array_equal(y, nbqat.fake_quantize_per_tensor_affine(x, 0.25, 3, -128, 127))
    want = torch.fake_quantize_per_tensor_affine(t, 0.25, 3, -128, 127).numpy()
    np.testing.assert_array_equal(y.view(np.uint32), want.view(np.uint32))


def test_torch_tensors_as_every_argument(torch, rng):
    """x, the per-channel scale / zero point and the STE mask as tensors: the NumPy results."""
    x = _x(rng)
    s = np.array([0.1, 0.2, 0.3, 0.4], np.float32)
    z = np.array([0, 1, -2, 3], np.int32)
    ts, tz, tx = torch.from_numpy(s), torch.from_numpy(z), torch.from_numpy(x)
    y, m = nbqat.fake_quantize_per_channel_affine_cachemask(tx, ts, tz, 0, -8, 7)
    y0, m0 = nbqat.fake_quantize_per_channel_affine_cachemask(x, s, z, 0, -8, 7)
    np.testing.assert_array_equal(y, y0)
    np.testing.assert_array_equal(m, m0)
    g = rng.standard_normal(x.shape).astype(np.float32)
    got = nbqat.fake_quantize_backward(torch.from_numpy(g), torch.from_numpy(m0))
    np.testing.assert_array_equal(got, np.where(m0, g, np.float32(0) * g))
    ys = nbqat.fake_quantize_per_tensor_affine(x, torch.tensor(0.5), torch.tensor(2), 0, 255)
    np.testing.assert_array_equal(ys, nbqat.fake_quantize_per_tensor_affine(x, 0.5, 2, 0, 255))


def test_dlpack_only_object(torch, rng):
    x = _x(rng, (17,))
    y = nbqat.fake_quantize_per_tensor_affine(_DLPackOnly(torch.from_numpy(x)), 0.5, 0, -4, 4)
    np.testing.assert_array_equal(y, nbqat.fake_quantize_per_tensor_affine(x, 0.5, 0, -4, 4))


def test_requires_grad_says_detach(torch, rng):
    t = torch.from_numpy(_x(rng)).requires_grad_()
    with pytest.raises(TypeError, match=r"x\.detach\(\)"):
        nbqat.fake_quantize_per_tensor_affine(t, 0.25, 0, -128, 127)
    with pytest.raises(TypeError, match=r"grad_y\.detach\(\)"):
        nbqat.fake_quantize_backward(t, np.ones(t.shape, bool))
    with pytest.raises(TypeError, match=r"scale\.detach\(\)"):
        nbqat.fake_quantize_learnable_per_channel_affine(
            _x(rng), torch.ones(4, requires_grad=True), np.zeros(4, np.float32), 0, 0, 255
        )
    y = nbqat.fake_quantize_per_tensor_affine(t.detach(), 0.25, 0, -128, 127)  # the fix works
    assert y.shape == tuple(t.shape)


def test_np_matrix_input_is_its_ndarray():
    """An ``np.matrix`` (it stays 2-D under ``reshape(-1)``) reached the compiled kernels
    and failed there with a Numba TypingError; it is computed as its plain ndarray view."""
    a = np.array([[0.33, -1.27, 2.5], [0.05, 1.55, -0.45]], np.float32)
    m = np.asmatrix(a)
    s, z = np.float32([0.1, 0.2, 0.3]), np.int32([0, 1, -1])

    def observed(v):
        obs = nbqat.PerChannelMinMaxObserver(ch_axis=1)
        obs(v)
        return obs.calculate_qparams()

    for f in (
        lambda v: (nbqat.fake_quantize_per_tensor_affine(v, 0.1, 0, -8, 7),),
        lambda v: (nbqat.fake_quantize_per_channel_affine(v, s, z, 1, -8, 7),),
        lambda v: (nbqat.fake_quantize_backward(v, a > 0),),
        lambda v: nbqat.fake_quantize_learnable_per_tensor_affine_backward(v, v, 0.1, 0.4, -8, 7),
        lambda v: (nbqat.fake_quantize_affine(v, (1, 3), s[:2, None], None, -8, 7),),
        observed,
    ):
        for got, want in zip(f(m), f(a), strict=True):
            assert type(got) is np.ndarray and np.array_equal(got, want)


def test_not_an_array_is_a_type_error():
    with pytest.raises(TypeError, match="`x` must be an array"):
        V.as_array(None, "x")
    with pytest.raises(TypeError, match="`x` must be an array"):
        V.as_array(object.__new__(_DLPackOnly), "x")  # __dlpack__ that fails


def test_one_cuda_array_predicate(cuda_sim):
    from nbqat.quantization import _validate_qparams, _validate_state

    assert V.is_cuda_array is _cuda.is_cuda_array
    assert V.check_scale is _validate_qparams.check_scale  # the siblings reachable from V
    assert V.check_state_qparams is _validate_state.check_state_qparams
    d = cuda_sim.to_device(np.zeros(3, np.float32))
    assert _cuda.is_cuda_array(d)
    assert not any(_cuda.is_cuda_array(a) for a in (np.zeros(3), 1.0, None, [1.0]))


def test_device_functions_are_the_cpu_formulas(cuda_sim):
    from nbqat.kernels import fake_quant_cuda as G
    from nbqat.kernels import fake_quant_formula as F

    for dev, cpu in [
        (G._gpu_fq, F.fake_quant_elem),
        (G._gpu_lsq_terms, F.lsq_terms),
        (G._gpu_ste, F.ste_elem),
        (G._quantize_code, F.quantize_code),
    ]:
        assert dev.py_func.__code__ is cpu.py_func.__code__
    # nested helpers resolve to their device twins, not to the CPU dispatchers (which the
    # simulator would also run, so only this check sees a missing rebinding)
    for dev in (G._gpu_fq, G._gpu_lsq_terms):
        assert dev.py_func.__globals__["quantize_code"] is G._quantize_code


def test_source_closure_follows_an_edit(tmp_path, monkeypatch):
    """The parsed imports are memoised per file version: after an edit of a module, its closure
    is the edited file's (a stale parse would keep a stale kernel key)."""
    import importlib
    import sys

    pkg = tmp_path / "closurepkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "b.py").write_text("B = 1\n")
    (pkg / "c.py").write_text("C = 2\n")
    (pkg / "a.py").write_text("from closurepkg import b\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        a = importlib.import_module("closurepkg.a")
        importlib.import_module("closurepkg.c")
        names = lambda: {os.path.basename(f) for f in _jit.source_closure(a.__file__)}  # noqa: E731
        assert names() == {"a.py", "b.py", "__init__.py"}
        (pkg / "a.py").write_text("from closurepkg import b\nfrom closurepkg import c\n")
        assert names() == {"a.py", "b.py", "c.py", "__init__.py"}
    finally:
        for m in [m for m in sys.modules if m.split(".")[0] == "closurepkg"]:
            del sys.modules[m]


def test_kernel_cache_keys_cover_the_formula_module():
    from nbqat.kernels import (
        fake_quant_cpu,
        fake_quant_formula,
        half_cpu,
        int8_cpu,
        lstm_cpu,
        nn_cpu,
        norm_cpu,
        qat_cpu,
        vmath_cpu,
    )

    formula = os.path.abspath(fake_quant_formula.__file__)
    for mod in (fake_quant_cpu, qat_cpu, int8_cpu):
        assert formula in _jit.source_closure(mod.__file__), mod.__name__
    closure = _jit.source_closure(nn_cpu.__file__)
    assert os.path.abspath(vmath_cpu.__file__) in closure
    assert os.path.abspath(lstm_cpu.__file__) in closure
    assert os.path.abspath(half_cpu.__file__) in _jit.source_closure(norm_cpu.__file__)
