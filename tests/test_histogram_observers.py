"""HistogramObserver against torch.ao.quantization.HistogramObserver (torch 2.13), its kernels
against torch's primitives and slow NumPy references, and the non-finite / huge-value cases."""

from __future__ import annotations

import warnings

import numba
import numpy as np
import pytest

import nbqat
from nbqat.kernels import histogram_cpu as hk
from nbqat.kernels import keygrid_cpu as kg
from nbqat.quantization._observer_stats import decode as decode_keys

CONFIGS = [
    ("quint8", "per_tensor_affine", False),
    ("qint8", "per_tensor_symmetric", False),
    ("qint8", "per_tensor_affine", True),
    ("quint8", "per_tensor_symmetric", False),
]


def _stream(rng, kind):
    """Batches whose range grows, shrinks or repeats (torch's combine paths)."""
    if kind == "growing":
        return [rng.standard_normal(800).astype(np.float32) * s for s in (1, 2, 0.5, 4)]
    if kind == "shifting":
        return [(rng.standard_normal(3000) + m).astype(np.float32) for m in (0, 1, -2, 3)]
    if kind == "positive":
        return [rng.exponential(size=2000).astype(np.float32) * s for s in (1, 3, 10)]
    if kind == "heavy":
        return [rng.standard_t(3, size=5000).astype(np.float32) for _ in range(3)]
    if kind == "constant_first":
        return [np.full(50, 0.5, np.float32), rng.uniform(-1, 3, 500).astype(np.float32)]
    raise AssertionError(kind)


def _torch_obs(torch, dtype, qscheme, rr, bins=2048, rate=16):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        o = torch.ao.quantization.HistogramObserver(
            bins=bins, dtype=getattr(torch, dtype), qscheme=getattr(torch, qscheme), reduce_range=rr
        )
    o.upsample_rate = rate
    return o


@pytest.mark.parametrize("kind", ["growing", "shifting", "positive", "heavy", "constant_first"])
@pytest.mark.parametrize(("dtype", "qscheme", "rr"), CONFIGS)
def test_qparams_and_histogram_equal_torch(torch, rng, kind, dtype, qscheme, rr):
    ours = nbqat.HistogramObserver(dtype=dtype, qscheme=qscheme, reduce_range=rr)
    ref = _torch_obs(torch, dtype, qscheme, rr)
    for x in _stream(rng, kind):
        ours(x)
        ref(torch.from_numpy(x))
    assert ours.min_val == ref.min_val.item() and ours.max_val == ref.max_val.item()
    _assert_same_as_torch(ours, ref)


def _assert_same_qparams(ours, ref):
    """The same zero point as torch's observer, the scale to 1e-6."""
    s, z = ours.calculate_qparams()
    ts, tz = ref.calculate_qparams()
    assert z[0] == tz.item()
    np.testing.assert_allclose(s[0], ts.item(), rtol=1e-6)


def _assert_same_as_torch(ours, ref):
    """The same histogram as torch's observer, the same zero point, the scale to 1e-6."""
    np.testing.assert_array_equal(ours.histogram, ref.histogram.numpy())
    _assert_same_qparams(ours, ref)


@pytest.mark.parametrize(("bins", "rate"), [(256, 8), (100, 3), (2048, 128)])
def test_other_bins_and_upsample_rates_equal_torch(torch, rng, bins, rate):
    ours = nbqat.HistogramObserver(bins=bins, upsample_rate=rate, dtype="qint8")
    ref = _torch_obs(torch, "qint8", "per_tensor_affine", False, bins, rate)
    for x in _stream(rng, "growing"):
        ours(x)
        ref(torch.from_numpy(x))
    _assert_same_as_torch(ours, ref)


@pytest.mark.parametrize("n", [3, 8, 15, 100, 2048, 2049, 4100])
def test_torch_sum_order(torch, rng, n):
    for _ in range(10):
        v = (rng.standard_normal(n) * rng.uniform(0.1, 1e4)).astype(np.float32)
        assert hk.torch_sum_f32(v) == np.float32(torch.from_numpy(v).sum().item())


@pytest.mark.parametrize(
    ("a", "b", "n"), [(-3.3, 7.1, 32769), (0.1, 5.3, 2049), (-1e-3, 2.0, 4097)]
)
def test_linspace_equals_torch(torch, a, b, n):
    a32, b32 = np.float32(a), np.float32(b)
    got = hk.linspace_f32(a32, b32, n)
    np.testing.assert_array_equal(got, torch.linspace(float(a32), float(b32), n).numpy())


def test_histc_equals_torch_and_numpy_reference(torch, rng):
    x = rng.standard_normal(5000).astype(np.float32)
    x[:7] = [np.nan, 5.0, -5.0, 1.0, -1.0, 0.999999, -0.25]
    lo, hi = np.float32(-1.0), np.float32(1.0)
    got = hk.histc_counts(x, lo, hi, 64, False)
    ref = torch.histc(torch.from_numpy(x), 64, min=-1.0, max=1.0).numpy()
    np.testing.assert_array_equal(got, ref)
    inside = x[(x >= lo) & (x <= hi)]
    pos = ((inside - lo) * np.float32(64) / (hi - lo)).astype(np.int64).clip(0, 63)
    np.testing.assert_array_equal(got, np.bincount(pos, minlength=64))


def test_counts_independent_of_thread_count(rng):
    x = rng.standard_normal(3 * hk.CHUNK + 11).astype(np.float32)
    old = numba.get_num_threads()
    try:
        numba.set_num_threads(1)
        one = hk.histc_counts(x, np.float32(-4), np.float32(4), 2048, False)
        k1 = kg.key_counts(x.view(np.int32), 16)
        f1 = hk.minmax_histc(x, x.view(np.int32), np.float32(-4), np.float32(4), 2048)
        numba.set_num_threads(old)
        many = hk.histc_counts(x, np.float32(-4), np.float32(4), 2048, False)
        kn = kg.key_counts(x.view(np.int32), 16)
        fn = hk.minmax_histc(x, x.view(np.int32), np.float32(-4), np.float32(4), 2048)
    finally:
        numba.set_num_threads(old)
    np.testing.assert_array_equal(one, many)
    np.testing.assert_array_equal(k1, kn)
    # the fused pass: the same counts, and the keys of the true min / max
    np.testing.assert_array_equal(f1[2], one)
    np.testing.assert_array_equal(fn[2], one)
    assert f1[:2] == fn[:2]
    assert decode_keys([f1[0]])[0] == x.min()
    assert decode_keys([f1[1]])[0] == x.max()
    assert one.sum() == np.count_nonzero(np.abs(x) <= 4)


@pytest.mark.parametrize("c", [0.0, 3.0, -2.5])
def test_constant_input_equals_torch(torch, c):
    ours, ref = nbqat.HistogramObserver(), _torch_obs(torch, "quint8", "per_tensor_affine", False)
    for _ in range(2):
        x = np.full(64, c, np.float32)
        ours(x)
        ref(torch.from_numpy(x))
    _assert_same_qparams(ours, ref)


@pytest.mark.parametrize("power", [100, -40])
def test_huge_and_tiny_values_are_scale_invariant(torch, rng, power):
    """torch's float32 norms overflow at 1e30 (underflow at 1e-11); nbqat's result is torch's
    on the data scaled to normal size, scaled back (powers of two: the float32 data is exactly
    scaled)."""
    x = [rng.standard_normal(2000).astype(np.float32) * s for s in (1, 3)]
    ref = _torch_obs(torch, "qint8", "per_tensor_symmetric", False)
    ours = nbqat.HistogramObserver(dtype="qint8", qscheme="per_tensor_symmetric")
    big = np.float32(2.0**power)
    for b in x:
        ref(torch.from_numpy(b))
        ours(b * big)
    np.testing.assert_array_equal(ours.histogram, ref.histogram.numpy())
    lo, hi = ours._search()  # the searched range (the scale itself is floored at eps)
    tlo, thi = (v.item() for v in ref._non_linear_param_search())
    np.testing.assert_allclose([lo / big, hi / big], [tlo, thi], rtol=1e-5)
    if power > 0:
        s, z = ours.calculate_qparams()
        ts, tz = ref.calculate_qparams()
        assert z[0] == tz.item()
        np.testing.assert_allclose(s[0] / big, ts.item(), rtol=1e-5)


def test_range_overflowing_float32_histogram():
    """[-3e38, 3e38]: float32 ``hi - lo`` is Inf (torch's bins are garbage); bins are float64."""
    x = np.array([-3e38, -1e38, 0.0, 1e38, 3e38], np.float32)
    o = nbqat.HistogramObserver(bins=10)
    o(x)
    x64 = x.astype(np.float64)
    pos = np.floor((x64 - x64.min()) * 10 / (x64.max() - x64.min())).astype(np.int64).clip(0, 9)
    np.testing.assert_array_equal(o.histogram, np.bincount(pos, minlength=10))
    s, _ = o.calculate_qparams()
    assert np.isfinite(s).all()


def _wide_batches(rng, kind):
    if kind == "extremes":
        return [np.array([-3e38, 3e38, 0.0, 1.0], np.float32)]
    return [(rng.standard_normal(1000) * 6e37).astype(np.float32) for _ in range(3)]


@pytest.mark.parametrize("kind", ["extremes", "normal x 6e37"])
def test_qparams_of_a_range_wider_than_float32_are_torch_on_scaled_data(torch, rng, kind):
    """``max - min`` overflows float32: the scale is torch's on the data scaled by 2**-120 to
    normal size, scaled back (torch itself gives scale inf, then refuses it), and FakeQuantize
    uses it."""
    batches = _wide_batches(rng, kind)
    ref = _torch_obs(torch, "quint8", "per_tensor_affine", False)
    ours = nbqat.HistogramObserver()
    small = np.float32(2.0**-120)
    for b in batches:
        ref(torch.from_numpy(b * small))
        ours(b)
    s, z = ours.calculate_qparams()
    ts, tz = ref.calculate_qparams()
    assert np.isfinite(s[0]) and z[0] == tz.item()
    np.testing.assert_allclose(s[0] * small, ts.item(), rtol=1e-5)
    fq = nbqat.FakeQuantize(observer=nbqat.HistogramObserver)
    for b in batches:
        y = fq(b)
    assert np.isfinite(y).all() and fq.scale[0] == s[0]
    grid = (y.astype(np.float64) / fq.scale[0]).round()  # every output on the integer grid
    np.testing.assert_allclose(y, grid * np.float64(fq.scale[0]), rtol=1e-6)


def test_nonfinite_policies(torch, rng):
    x = rng.standard_normal(300).astype(np.float32)
    bad = x.copy()
    bad[[3, 9]] = [np.inf, -np.inf]
    o = nbqat.HistogramObserver()
    o(x)
    before = o.state_dict()
    with pytest.raises(ValueError, match="1 \\+Inf and 1 -Inf"):
        o(bad)
    for k, v in o.state_dict().items():
        np.testing.assert_array_equal(v, before[k])
    ign = nbqat.HistogramObserver(nonfinite="ignore")
    ign(bad)
    ref = _torch_obs(torch, "quint8", "per_tensor_affine", False)
    ref(torch.from_numpy(bad[np.isfinite(bad)]))
    np.testing.assert_array_equal(ign.histogram, ref.histogram.numpy())
    prop = nbqat.HistogramObserver(nonfinite="propagate")
    with pytest.warns(UserWarning, match="torch.inf detected"):
        prop(bad)
    np.testing.assert_array_equal(prop.histogram, ref.histogram.numpy())
    nan = x.copy()
    nan[0] = np.nan
    with pytest.raises(ValueError, match="1 NaN"):
        prop(nan)
    ign(np.array([np.nan, np.inf], np.float32))  # nothing finite: unchanged
    np.testing.assert_array_equal(ign.histogram, ref.histogram.numpy())


def test_state_dict_round_trip_and_torch_state(torch, rng):
    ref = _torch_obs(torch, "qint8", "per_tensor_affine", False)
    for b in _stream(rng, "growing"):
        ref(torch.from_numpy(b))
    ours = nbqat.HistogramObserver(dtype="qint8")
    ours.load_state_dict({k: v.numpy() for k, v in ref.state_dict().items()})
    _assert_same_qparams(ours, ref)
    again = nbqat.HistogramObserver(dtype="qint8")
    again.load_state_dict(ours.state_dict())
    np.testing.assert_array_equal(again.histogram, ours.histogram)
    with pytest.raises(ValueError, match=r"histogram must have shape \(2048,\), got \(3,\)"):
        again.load_state_dict({**ours.state_dict(), "histogram": np.ones(3, np.float32)})
    negative = np.ones(2048, np.float32)
    negative[5] = -1
    with pytest.raises(ValueError, match=r"non-negative counts, got histogram\[5\] = -1"):
        again.load_state_dict({**ours.state_dict(), "histogram": negative})
    np.testing.assert_array_equal(again.histogram, ours.histogram)


def test_merge_equals_sequential_observation(rng):
    a_data = rng.standard_normal(1000).astype(np.float32)
    b_data = rng.standard_normal(1000).astype(np.float32) * 3  # b's range contains a's
    seq = nbqat.HistogramObserver()
    seq(a_data)
    seq(b_data)
    a, b = nbqat.HistogramObserver(), nbqat.HistogramObserver()
    a(a_data)
    b(b_data)
    a.merge(b)
    np.testing.assert_array_equal(a.histogram, seq.histogram)
    (sa, za), (ss, zs) = a.calculate_qparams(), seq.calculate_qparams()
    np.testing.assert_allclose(sa, ss, rtol=1e-6)
    np.testing.assert_array_equal(za, zs)
    empty = nbqat.HistogramObserver()
    np.testing.assert_array_equal(empty.merge(a).histogram, a.histogram)
    with pytest.raises(ValueError, match="different configurations"):
        a.merge(nbqat.HistogramObserver(bins=16))


def test_bad_arguments():
    with pytest.raises(TypeError, match="bins"):
        nbqat.HistogramObserver(bins=2.5)
    with pytest.raises(ValueError, match="upsample_rate"):
        nbqat.HistogramObserver(upsample_rate=0)
    with pytest.raises(ValueError, match="per_tensor"):
        nbqat.HistogramObserver(qscheme="per_channel_affine")
    with pytest.raises(TypeError, match="must be an array"):
        nbqat.HistogramObserver()(None)
    with pytest.warns(UserWarning, match="must run observer"):
        s, z = nbqat.HistogramObserver().calculate_qparams()
    assert s[0] == 1.0 and z[0] == 0


def test_fake_quantize_with_histogram_observer(rng):
    fq = nbqat.FakeQuantize(observer=nbqat.HistogramObserver, dtype="quint8")
    x = rng.standard_normal(200).astype(np.float32)
    y = fq(x)
    s, z = fq.activation_post_process.calculate_qparams()
    q = np.clip(np.rint(x / s[0]) + z[0], 0, 255)
    np.testing.assert_allclose(y, (q - z[0]) * s[0], atol=1e-6)


@pytest.mark.parametrize("seed", range(6))
def test_random_streams_equal_torch(torch, seed):
    """Random batch counts, sizes, scales and shapes of distribution (fixed seeds)."""
    rng = np.random.default_rng(100 + seed)
    dtype, qscheme, rr = CONFIGS[seed % 4]
    ours = nbqat.HistogramObserver(dtype=dtype, qscheme=qscheme, reduce_range=rr)
    ref = _torch_obs(torch, dtype, qscheme, rr)
    for _ in range(int(rng.integers(1, 6))):
        n = int(rng.integers(1, 20_000))
        kind = rng.integers(3)
        if kind == 0:
            x = rng.standard_normal(n) * rng.uniform(0.01, 100) + rng.normal() * rng.uniform(0, 10)
        elif kind == 1:
            x = rng.exponential(size=n) * rng.uniform(0.1, 10)
        else:
            x = rng.standard_t(2, size=n)
        x = x.astype(np.float32)
        ours(x)
        ref(torch.from_numpy(x))
    _assert_same_as_torch(ours, ref)


@pytest.mark.parametrize(
    ("dtype", "qscheme", "qmin", "qmax"),
    [
        ("quint8", "per_tensor_affine", 0, 127),
        ("qint8", "per_tensor_symmetric", -127, 127),
        ("quint8", "per_tensor_symmetric", 0, 255),
    ],
)
def test_custom_ranges_equal_torch(torch, rng, dtype, qscheme, qmin, qmax):
    ours = nbqat.HistogramObserver(dtype=dtype, qscheme=qscheme, quant_min=qmin, quant_max=qmax)
    ref = torch.ao.quantization.HistogramObserver(
        dtype=getattr(torch, dtype), qscheme=getattr(torch, qscheme), quant_min=qmin, quant_max=qmax
    )
    for s in (1, 2, 5):
        x = (rng.standard_normal(3000) * s + 0.5).astype(np.float32)
        ours(x)
        ref(torch.from_numpy(x))
    _assert_same_qparams(ours, ref)


@pytest.mark.parametrize(
    "cls", [nbqat.HistogramObserver, nbqat.MSEObserver, nbqat.PercentileObserver]
)
def test_set_min_max_refused_where_the_state_is_counts(rng, cls):
    # the inherited set_min_max moved min/max under the histogram: its counts were then read
    # over the new range (HistogramObserver: scale 0.78 instead of 0.027 for N(0, 1) data)
    obs = cls()
    obs(rng.standard_normal(1000).astype(np.float32))
    before = obs.calculate_qparams()
    with pytest.raises(TypeError, match="set_min_max"):
        obs.set_min_max(-100.0, 100.0)
    after = obs.calculate_qparams()
    assert all(np.array_equal(a, b) for a, b in zip(before, after))


def test_float16_input_is_binned_as_its_float32_copy(torch, rng):
    # documented (docs/semantics.md): torch's float16 histc overflows (x - min) * bins in
    # float16 past a range of 32 and counts those values in bin 0; nbqat bins the exact values
    x = np.concatenate([[0.0, 100.0], rng.uniform(0, 100, 500)]).astype(np.float16)
    ours, ref = nbqat.HistogramObserver(), torch.ao.quantization.HistogramObserver()
    ours(x)
    ref(torch.from_numpy(x.astype(np.float32)))
    np.testing.assert_array_equal(ours.histogram, ref.histogram.numpy())
    s, z = ours.calculate_qparams()
    ts, tz = ref.calculate_qparams()
    np.testing.assert_allclose(s, ts.numpy(), rtol=1e-6)
    np.testing.assert_array_equal(z, tz.numpy())
    half = torch.ao.quantization.HistogramObserver()
    half(torch.from_numpy(x))
    assert half.histogram[0] > 0.5 * x.size  # torch's float16 path: values >= 32 in bin 0
