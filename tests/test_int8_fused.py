"""The int8 engine's fast path (codes minus the zero point in float32, a BLAS matmul, in-place
requantization; the fused LSTM recurrence) gives the integer path's results bit for bit."""

from __future__ import annotations

import numpy as np
import pytest
from ref_nn import observed_lstm

from nbqat.kernels.int8_cpu import F32_EXACT, QLINEAR_BLOCK_ROWS
from nbqat.nn import Linear, ParameterBuffer
from nbqat.nn.int8 import FrozenFakeQuantize, Int8Linear, Int8LSTM, quantize_per_tensor
from nbqat.quantization.qconfig import default_qat_qconfig as qc


def _same(a, b):
    assert a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


def _linear(rng, k, n, scale=3.0):
    lin = Linear(k, n)
    ParameterBuffer(lin, np.float32, seed=int(rng.integers(1 << 30)))
    lin.weight_fake_quant, lin.input_fake_quant = qc.weight(), qc.activation()
    lin.forward((rng.standard_normal((16, k)) * scale).astype(np.float32))
    return Int8Linear(lin.weight, lin.bias, lin.weight_fake_quant, lin.input_fake_quant)


@pytest.mark.parametrize("k,n", [(1, 1), (12, 5), (16, 16), (16, 64), (96, 6), (513, 3)])
def test_fast_linear_equals_integer_path(rng, k, n):
    i8 = _linear(rng, k, n)
    assert i8._fused and k * 255 * 128 <= F32_EXACT
    x = (rng.standard_normal((7, 3, k)) * 4).astype(np.float32)
    x.reshape(-1)[:4] = [np.nan, np.inf, -np.inf, -0.0]
    for add_bias in (True, False):
        fast = i8.forward(x, add_bias)
        i8._fused = False
        slow = i8.forward(x, add_bias)
        i8._fused = True
        _same(fast, slow)
    _same(i8.forward(x[:0]), np.empty((0, 3, n), np.float32))


def test_wide_layers_keep_the_integer_path(rng):
    i8 = _linear(rng, 1100, 2)
    assert not i8._fused  # 1100 * 128 * 127 > 2**24: float32 could round a partial sum


def test_fused_lstm_equals_step_by_step(rng):
    lstm, xs, h0, c0 = observed_lstm(rng, 5, 16, batch=9, steps=11, seed=3)
    i8 = Int8LSTM(lstm)
    fast = i8.forward(xs, h0, c0)
    i8.hh._fused = i8.ih._fused = False
    slow = i8.forward(xs, h0, c0)
    for a, b in zip((fast[0], *fast[1]), (slow[0], *slow[1]), strict=True):
        _same(a, b)


@pytest.mark.parametrize(
    "rows", [QLINEAR_BLOCK_ROWS - 1, QLINEAR_BLOCK_ROWS, 2 * QLINEAR_BLOCK_ROWS + 7]
)
def test_fast_linear_row_blocks(rng, rows):
    i8 = _linear(rng, 16, 32)
    x = (rng.standard_normal((rows, 16)) * 4).astype(np.float32)
    fast = i8.forward(x)
    i8._fused = False
    _same(fast, i8.forward(x))


def test_frozen_fake_quantize_is_the_codes_formula(rng):
    fq = qc.activation()
    fq.forward(rng.random((8, 16)).astype(np.float32))
    ffq = FrozenFakeQuantize(fq, "p")
    x = (rng.random((3, 4, 5, 7)) * 1.2 - 0.1).astype(np.float32)
    x.reshape(-1)[:5] = [np.nan, np.inf, -np.inf, -0.0, 1e30]
    q = quantize_per_tensor(x, ffq.scale, ffq.zero_point, ffq.quant_min, ffq.quant_max)
    _same(ffq.forward(x), (q - ffq.zero_point).astype(np.float32) * ffq.scale)
    _same(ffq.forward(x.astype(np.float64)), ffq.forward(x))
