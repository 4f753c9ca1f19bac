"""Low-bit QAT (issue 30): the grouped int4 / per-token / float8 quantizers against torchao
0.18's QAT modules (``Int8DynActInt4WeightQATLinear``'s fake quantizers, bit for bit), the
prepare_qat flow against torchao's QAT linear, and the engine's grouped path against torchao's
``quantize_affine`` codes and a slow integer reference."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from ref_lowbit import assert_same_bits, load_quant_primitives

import nbqat
from nbqat.nn import (
    ELU,
    Linear,
    LSTMForecaster,
    LSTMForecasterConfig,
    ParameterBuffer,
    Sequential,
    prepare_qat,
)
from nbqat.nn.convert import convert
from nbqat.nn.int4 import GroupedLinear
from nbqat.quantization.lowbit_quantize import (
    Float8FakeQuantize,
    GroupFakeQuantize,
    PerTokenFakeQuantize,
)
from nbqat.quantization.qconfig import float8_qconfig, int4_weight_qconfig


@pytest.fixture(scope="module")
def tao(torch):
    load_quant_primitives()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from torchao.quantization.qat import linear as tlin
        from torchao.quantization.qat.fake_quantizer import IntxFakeQuantizer
    return tlin, IntxFakeQuantizer


def _x(shape, seed=0, scale=1.0):
    return (np.random.default_rng(seed).standard_normal(shape) * scale).astype(np.float32)


@pytest.mark.parametrize(("shape", "g"), [((6, 64), 16), ((5, 24), 8), ((4, 32), 32)])
def test_group_weight_matches_torchao_8da4w(torch, tao, shape, g):
    tlin, Intx = tao
    w = _x(shape, 1)
    fq = GroupFakeQuantize(g)
    y = fq.forward(w)
    ref = Intx(tlin._get_8da4w_weight_config(g, torch.float32))
    wt = torch.from_numpy(w.copy()).requires_grad_(True)
    yt = ref(wt)
    assert_same_bits(y, yt.detach().numpy(), "8da4w weight")
    assert_same_bits(fq.scale, ref.scale.numpy(), "scale")
    assert fq.per_channel_fallback is False
    # STE: torch autograd through torchao's _fake_quantize_affine with the scale detached
    qp = load_quant_primitives()
    wt2 = torch.from_numpy(w.copy()).requires_grad_(True)
    y2 = qp._fake_quantize_affine(wt2, (1, g), ref.scale, ref.zero_point, torch.int32, -8, 7)
    gy = _x(shape, 2)
    y2.backward(torch.from_numpy(gy))
    gt = wt2.grad.numpy()  # where(mask, g * s, 0) / s: grad * mask up to one rounding
    np.testing.assert_array_equal(fq.ctx, gt != 0)
    np.testing.assert_allclose(fq.backward(gy), gt, rtol=1e-6, atol=0)


def test_group_fallback_is_per_channel(torch, tao):
    tlin, Intx = tao
    w = _x((4, 24), 3)
    fq = GroupFakeQuantize(16)  # 24 is no multiple of 16: one group per row
    y = fq.forward(w)
    assert fq.per_channel_fallback is True and fq.block_size == (1, 24)
    ref = Intx(tlin._get_8da4w_weight_config(24, torch.float32))
    assert_same_bits(y, ref(torch.from_numpy(w)).numpy(), "per-channel fallback")
    assert GroupFakeQuantize(64).forward(w) is not None  # G > K: per channel too


def test_per_token_matches_torchao_8da4w(torch, tao):
    tlin, Intx = tao
    x = _x((3, 5, 32), 4, 3.0)
    fq = PerTokenFakeQuantize()
    ref = Intx(tlin._get_8da4w_activation_config(torch.float32))
    assert_same_bits(fq.forward(x), ref(torch.from_numpy(x)).numpy(), "per-token")
    assert_same_bits(fq.scale, ref.scale.reshape(3, 5).numpy(), "per-token scale")


def test_float8_weight_matches_torchao(torch):
    qp = load_quant_primitives()
    w = _x((6, 40), 5)
    fq = Float8FakeQuantize("float8_e4m3fn", "per_row")
    y = fq.forward(w)
    wt = torch.from_numpy(w)
    s = qp._choose_scale_float8(wt, [1, 40], torch.float8_e4m3fn)
    q = qp._quantize_affine_float8(wt, s, torch.float8_e4m3fn)
    assert_same_bits(y, qp._dequantize_affine_float8(q, s, torch.float32).numpy(), "float8")


def _mlp(k_in=32):
    m = Sequential(Linear(k_in, 32), ELU(), Linear(32, 24), ELU(), Linear(24, 3))
    ParameterBuffer(m, dtype=np.float32, seed=0)
    return m


def test_prepare_qat_matches_torchao_linear(torch, tao):
    """prepare_qat with the 8da4w qconfig: every Linear equals torchao's QAT linear."""
    tlin, _ = tao
    m = _mlp()
    qat = prepare_qat(m, int4_weight_qconfig(16, "per_token"))
    qat.calibrate([])
    x = _x((7, 32), 6)
    lin = qat.model[0]
    ref = tlin.Int8DynActInt4WeightQATLinear(32, 32, bias=True, groupsize=16)
    with torch.no_grad():
        ref.weight.copy_(torch.from_numpy(np.asarray(lin.weight)))
        ref.bias.copy_(torch.from_numpy(np.asarray(lin.bias)))
    y = lin.forward(x)
    np.testing.assert_allclose(y, ref(torch.from_numpy(x)).detach().numpy(), rtol=0, atol=2e-6)
    assert isinstance(lin.weight_fake_quant, GroupFakeQuantize)
    qat.model.forward(x)
    assert qat.model[4].weight_fake_quant.per_channel_fallback is True  # 24 % 16


def test_weight_only_and_errors():
    qat = prepare_qat(_mlp(), int4_weight_qconfig(8, None))
    assert all(isinstance(f, GroupFakeQuantize) for f in qat.fake_quants.values())
    assert qat.model[0].input_fake_quant is None
    with pytest.raises(ValueError, match="group_size"):
        int4_weight_qconfig(0)
    with pytest.raises(TypeError, match="group_size"):
        int4_weight_qconfig(True)
    with pytest.raises(ValueError, match="activation"):
        int4_weight_qconfig(8, "per_channel")
    with pytest.raises(ValueError, match="learnable_scales"):
        prepare_qat(_mlp(), int4_weight_qconfig(8), config=nbqat.QATConfig(learnable_scales=True))
    with pytest.raises(TypeError, match="float32"):
        GroupFakeQuantize(8).forward(np.zeros((2, 8)))


def _slow_grouped(x, lin):
    """Integer reference: Python ints per group, then the rescaled sum in float64."""
    xs, xz = float(lin.input_scale), lin.input_zero_point
    xq = np.clip(np.rint(x.astype(np.float32) * (np.float32(1) / lin.input_scale)) + xz, 0, 255)
    n, k = lin.weight_q.shape
    b = lin.block_size[-1]
    out = np.empty((x.shape[0], n), np.float32)
    for i in range(x.shape[0]):
        for j in range(n):
            tot = 0.0
            for g in range(k // b):
                acc = sum(
                    (int(xq[i, c]) - xz)
                    * (int(lin.weight_q[j, c]) - int(lin.weight_zero_point[j, g]))
                    for c in range(g * b, (g + 1) * b)
                )
                tot += acc * (xs * float(lin.weight_scale[j, g]))
            out[i, j] = np.float32(tot) + lin.bias[j]
    return out


@pytest.mark.parametrize("act", ["per_tensor", "per_token", None])
def test_convert_grouped_engine(torch, act):
    qp = load_quant_primitives()
    qat = prepare_qat(_mlp(), int4_weight_qconfig(16, act))
    x = _x((9, 32), 7)
    qat.calibrate([(x,)] * 2)
    qat.freeze_observers()
    y = qat.model.forward(x)
    int8 = convert(qat)
    lin = int8.layers["0"].int8
    assert isinstance(lin, GroupedLinear) and lin.weight_q.dtype == np.int8
    wfq = qat.model[0].weight_fake_quant
    codes = qp.quantize_affine(
        torch.from_numpy(np.asarray(qat.model[0].weight)),
        (1, 16),
        torch.from_numpy(wfq.scale),
        torch.from_numpy(wfq.zero_point),
        torch.int8,
        -8,
        7,
    )
    np.testing.assert_array_equal(lin.weight_q, codes.numpy())
    if act == "per_tensor":
        np.testing.assert_allclose(lin.forward(x), _slow_grouped(x, lin), rtol=1e-6, atol=1e-6)
    y8 = int8(x)
    np.testing.assert_allclose(y8, y, rtol=0, atol=1e-5)


def test_float8_qconfig_flow():
    qat = prepare_qat(_mlp(), float8_qconfig())
    x = _x((5, 32), 8)
    qat.calibrate([(x,)])
    qat.freeze_observers()
    y = qat.model.forward(x)
    np.testing.assert_allclose(convert(qat)(x), y, rtol=0, atol=1e-6)


def test_float8_qconfig_bounds_an_all_zero_block(torch):
    """float8_qconfig's quantizers clamp max |x| at 1e-12 (torchao's float8 training EPS): an
    all-zero block (the LSTM forecaster's zero initial state) quantized to NaN (scale 0, then
    0 / 0), so every output of a float8 LSTMForecaster was NaN; torchao's primitive with
    the same bound is the oracle, and a block above the bound keeps the unbounded bits."""
    qp = load_quant_primitives()
    act = float8_qconfig().activation()
    assert act.hp_value_lb == 1e-12 and "hp_value_lb=1e-12" in repr(act)
    x = _x((5, 32), 9)
    x[2] = 0.0
    for block in (np.zeros((5, 32), np.float32), x):
        t = torch.from_numpy(block)
        s = qp._choose_scale_float8(t, list(block.shape), torch.float8_e4m3fn, hp_value_lb=1e-12)
        q = qp._quantize_affine_float8(t, s, torch.float8_e4m3fn)
        want = qp._dequantize_affine_float8(q, s, torch.float32).numpy()
        assert_same_bits(act.forward(block), want, "float8 bounded")
    assert_same_bits(act.forward(x), Float8FakeQuantize(granularity="per_tensor").forward(x), "lb")
    with pytest.raises(ValueError, match="hp_value_lb must be None or a finite float >= 0"):
        Float8FakeQuantize(hp_value_lb=-1.0)
    cfg = LSTMForecasterConfig(
        num_static_features=2, num_known_features=3, num_unknown_features=4, hidden_dim=8,
        sequence_length=6, prediction_horizon=3,
    )  # fmt: skip
    qat = prepare_qat(LSTMForecaster(cfg, seed=0), float8_qconfig())
    rng = np.random.default_rng(0)
    b = [rng.standard_normal(s).astype(np.float32) for s in ((4, 2), (4, 6, 4), (4, 3, 3))]
    qat.calibrate([tuple(b)])
    assert np.isfinite(qat.predict(*b)).all()


def test_train_weight_format_options():
    from nbqat.train.config import TrainConfig
    from nbqat.train.parser import build_parser

    with pytest.raises(ValueError, match="--group-size needs --weight-bits 4"):
        TrainConfig(group_size=16).resolved()
    with pytest.raises(ValueError, match="--group-size must be a positive"):
        TrainConfig(weight_bits=4, group_size=0).resolved()
    with pytest.raises(ValueError, match="--weight-dtype"):
        TrainConfig(weight_bits=4, weight_dtype="float8_e4m3fn").resolved()
    assert TrainConfig().resolved().weight_format()["name"] == "int8"
    args = build_parser().parse_args(["train", "--weight-bits", "4", "--group-size", "16"])
    fmt = TrainConfig.from_args(args).resolved().weight_format()
    assert fmt == {"weight_bits": 4, "group_size": 16, "weight_dtype": "int", "name": "int4_g16"}


def test_low_bit_quantizers_load_their_own_states_and_check_the_whole_state(rng):
    # a Float8FakeQuantize state with an all-zero row (scale 0, torchao's) was refused by its
    # own load_state_dict ("scales must be > 0"); a bad block_size failed after the flags and
    # qparams were loaded (a half-written module); a flag of 7 loaded as True and an int64
    # zero point 2**32 + 1 as 1
    w = np.zeros((4, 8), np.float32)
    w[0] = rng.standard_normal(8)
    f8 = Float8FakeQuantize()
    y = f8(w)
    other = Float8FakeQuantize()
    other.load_state_dict(f8.state_dict())
    other.disable_observer()
    np.testing.assert_array_equal(other(w), y)  # NaN rows compare equal
    g = GroupFakeQuantize(32)
    x = rng.standard_normal((4, 64)).astype(np.float32)
    g(x)
    sd = g.state_dict()
    fresh = GroupFakeQuantize(32)
    before = fresh.state_dict()
    for bad in (
        {**sd, "block_size": np.array([1.5, 32.0]), "fake_quant_enabled": np.uint8([0])},
        {**sd, "fake_quant_enabled": np.array([7])},
        {**sd, "zero_point": np.full(sd["zero_point"].shape, 2**32 + 1, np.int64)},
    ):
        with pytest.raises(ValueError):
            fresh.load_state_dict(bad)
        after = fresh.state_dict()
        assert all(np.array_equal(before[k], after[k]) for k in before)
        assert fresh.block_size is None and fresh.fake_quant_enabled
    fresh.load_state_dict(sd)
    fresh.disable_observer()
    np.testing.assert_array_equal(fresh(x), g(x))
