"""PercentileObserver and MSEObserver against NumPy references (np.quantile, the fake-quant MSE
computed on the raw data), torch's qparams formula, and exact merging."""

from __future__ import annotations

import numpy as np
import pytest

import nbqat
from nbqat.quantization import range_observers as R


def _fq(v, s, z, qmin, qmax):
    return (np.clip(np.rint(v / s) + z, qmin, qmax) - z) * s


@pytest.mark.parametrize("p", [99.0, 99.9, 99.99])
def test_percentile_quantiles_match_numpy(rng, p):
    x = rng.standard_t(3, size=60_000).astype(np.float32)
    o = nbqat.PercentileObserver(percentile=p)
    for part in np.array_split(x, 3):
        o(part)
    xs = np.sort(x.astype(np.float64))
    n = xs.size
    for q in (p / 100, 1 - p / 100, 0.5):
        got = float(o.quantile(q))
        # between the order statistics around rank q * n, up to one grid bin (2**-7 relative)
        r = q * n
        lower = xs[max(int(np.floor(r)) - 1, 0)]
        upper = xs[min(int(np.ceil(r)), n - 1)]
        tol = 2**-7 * max(abs(lower), abs(upper))
        assert lower - tol <= got <= upper + tol
        assert abs(got - np.quantile(xs, q)) <= (upper - lower) + tol


@pytest.mark.parametrize("kind", ["both signs", "all negative", "all positive"])
def test_percentile_quantile_ends_are_min_and_max(rng, kind):
    # q = 0 is the minimum and q = 1 the maximum (the empty NaN/-Inf bins below the data
    # have edges 0: q = 0 gave 0.0 for data of both signs, max_val for all-negative data)
    x = rng.standard_t(3, size=5_000).astype(np.float32) * np.float32(6)
    x = {"both signs": x, "all negative": -np.abs(x) - 1, "all positive": np.abs(x) + 1}[kind]
    x = x.astype(np.float32)
    o = nbqat.PercentileObserver()
    o(x)
    assert o.quantile(0.0) == x.min() and o.quantile(1.0) == x.max()
    xs, n, tiny = np.sort(x.astype(np.float64)), x.size, 1e-12
    for q in (tiny, 0.5, 1 - tiny):
        got, ref = float(o.quantile(q)), float(np.quantile(xs, q))
        r = q * (n - 1)  # np.quantile's rank: between the neighbouring order statistics
        lower, upper = xs[max(int(np.floor(r)) - 1, 0)], xs[min(int(np.ceil(r)) + 1, n - 1)]
        tol = 2**-7 * max(abs(lower), abs(upper))  # the documented bin width
        assert lower - tol <= got <= upper + tol
        assert abs(got - ref) <= (upper - lower) + tol


def test_percentile_qparams_are_torch_formula_on_the_range(torch, rng):
    x = rng.standard_normal(10_000).astype(np.float32)
    o = nbqat.PercentileObserver(percentile=99.9, dtype="qint8", qscheme="per_tensor_symmetric")
    o(x)
    lo, hi = o.quantile(1 - 99.9 / 100), o.quantile(99.9 / 100)
    ref = torch.ao.quantization.MinMaxObserver(
        dtype=torch.qint8, qscheme=torch.per_tensor_symmetric
    )
    ref(torch.tensor([lo, hi], dtype=torch.float32))
    s, z = o.calculate_qparams()
    ts, tz = ref.calculate_qparams()
    assert s[0] == np.float32(ts.item()) and z[0] == tz.item()


def test_percentile_100_is_minmax(rng):
    x = rng.standard_normal(999).astype(np.float32)
    o, m = nbqat.PercentileObserver(percentile=100), nbqat.MinMaxObserver()
    o(x)
    m(x)
    assert o.calculate_qparams() == m.calculate_qparams()


@pytest.mark.parametrize("cls", [nbqat.PercentileObserver, nbqat.MSEObserver])
def test_merge_is_exact(rng, cls):
    parts = [rng.standard_normal(n).astype(np.float32) * s for n, s in ((500, 1), (700, 5))]
    one, a, b = cls(), cls(), cls()
    for p in parts:
        one(p)
    a(parts[0])
    b(parts[1])
    b.merge(a)
    for k, v in one.state_dict().items():
        np.testing.assert_array_equal(b.state_dict()[k], v)
    np.testing.assert_array_equal(b.calculate_qparams()[0], one.calculate_qparams()[0])
    assert int(one.histogram.sum()) == 1200


def test_state_dict_round_trip_and_errors(rng):
    o = nbqat.PercentileObserver()
    o(rng.standard_normal(100).astype(np.float32))
    p = nbqat.PercentileObserver()
    p.load_state_dict(o.state_dict())
    assert p.calculate_qparams() == o.calculate_qparams()
    np.testing.assert_array_equal(p.histogram, o.histogram)
    st = o.state_dict()
    assert st["histogram_count"].sum() == 100 and st["histogram_index"].size <= 100
    with pytest.raises(ValueError, match="histogram_index must be"):
        p.load_state_dict({**st, "histogram_count": -st["histogram_count"]})
    with pytest.raises(ValueError, match="histogram_index must be"):
        p.load_state_dict({**st, "histogram_index": st["histogram_index"][::-1].copy()})
    np.testing.assert_array_equal(p.histogram, o.histogram)
    with pytest.raises(ValueError, match="propagate"):
        nbqat.MSEObserver(nonfinite="propagate")
    with pytest.raises(ValueError, match="percentile"):
        nbqat.PercentileObserver(percentile=20)
    with pytest.raises(ValueError, match="mantissa_bits"):
        nbqat.PercentileObserver(mantissa_bits=12)


def test_nonfinite_raise_and_ignore(rng):
    x = rng.standard_normal(50).astype(np.float32)
    x[5] = np.nan
    o = nbqat.MSEObserver()
    with pytest.raises(ValueError, match="1 NaN"):
        o(x)
    assert o.histogram.sum() == 0
    i = nbqat.MSEObserver(nonfinite="ignore")
    i(x)
    assert i.histogram.sum() == 49


def _direct_mse(x, obs, lo, hi):
    s, z = obs._qparams(np.asarray(lo, np.float32), np.asarray(hi, np.float32))
    return float(np.sum((_fq(x, s.astype(np.float64), z, obs.quant_min, obs.quant_max) - x) ** 2))


@pytest.mark.parametrize(
    ("dtype", "qscheme"), [("quint8", "per_tensor_affine"), ("qint8", "per_tensor_symmetric")]
)
def test_mse_per_tensor_picks_the_direct_minimum(rng, dtype, qscheme):
    x = np.concatenate([rng.standard_normal(20_000), [40.0, -35.0]]).astype(np.float32)
    o = nbqat.MSEObserver(dtype=dtype, qscheme=qscheme, num_candidates=50)
    o(x)
    x64 = x.astype(np.float64)
    alphas = np.arange(1, 51) / 50
    direct = [_direct_mse(x64, o, a * x.min(), a * x.max()) for a in alphas]
    lo, hi = o._range()
    chosen = _direct_mse(x64, o, lo, hi)
    assert chosen <= min(direct) * 1.02  # the histogram estimate picks (nearly) the best
    assert chosen < direct[-1] and hi < x.max()  # it clips the two outliers


def test_mse_per_channel_weights(rng):
    # 4000 values a channel: the histogram's expected error is then within rounding noise of
    # the exact error of these values (with a few hundred the two differ by ~10%)
    w = rng.standard_normal((6, 4000)).astype(np.float32)
    w[2, 7] = 30.0  # one outlier channel
    o = nbqat.MSEObserver(dtype="qint8", qscheme="per_channel_symmetric", ch_axis=0)
    o(w)
    s, z = o.calculate_qparams()
    assert s.shape == (6,) and (z == 0).all()
    lo, hi = o._range()
    for c in range(6):
        row = w[c].astype(np.float64)
        direct = [
            _direct_mse(row, o, a * row.min(), a * row.max()) for a in np.arange(1, 101) / 100
        ]
        assert _direct_mse(row, o, lo[c], hi[c]) <= min(direct) * 1.03
    assert hi[2] < 30.0  # the outlier is clipped


def test_mse_error_estimate_matches_data(rng):
    x = rng.standard_normal(5000).astype(np.float32)
    o = nbqat.MSEObserver()
    o(x)
    h, mins, maxs = o._bins_2d()
    vlo, vhi = R._grid_edges(o._shift)
    s, z = o._qparams(np.array([-2.0], np.float32), np.array([2.0], np.float32))
    est = R._kg.mse_errors(
        h, vlo, vhi, mins, maxs, s.reshape(1, 1), z.reshape(1, 1) * 1.0, 0.0, 255.0, 4
    )
    ref = _direct_mse(x.astype(np.float64), o, -2.0, 2.0)
    assert est[0, 0] == pytest.approx(ref, rel=0.05)


def test_key_grid_counts_match_numpy(rng):
    x = (rng.standard_normal(4000) * 10.0 ** rng.integers(-20, 20, 4000)).astype(np.float32)
    x[:3] = [np.nan, np.inf, -0.0]
    got = R._kg.key_counts(x.view(np.int32), 16)
    w = x.view(np.int32).astype(np.int64)
    fin = np.isfinite(x)
    k = np.where(w >= 0, w, w ^ 0x7FFFFFFF)[fin]
    np.testing.assert_array_equal(got, np.bincount((k >> 16) + 32768, minlength=65536))


# -- issue 29, item 5: the search is exact on the values seen -------------------------------


def _candidate_errors(x, obs):
    """(K, R) oracle: the exact float64 fake-quant error of every row of ``x`` under every
    candidate ``alpha * [min, max]`` of the observer's own set (NumPy, row by row)."""
    k = obs.num_candidates
    out = np.empty((k, len(x)))
    for i, a in enumerate(np.arange(1, k + 1) / k):
        for r, row in enumerate(x):
            out[i, r] = _direct_mse(row, obs, a * row.min(), a * row.max())
    return out


def _errors_of(x, obs, scale, zp):
    s, z = np.reshape(scale, (-1, 1)).astype(np.float64), np.reshape(zp, (-1, 1))
    return np.sum((_fq(x, s, z, obs.quant_min, obs.quant_max) - x) ** 2, axis=1)


@pytest.mark.parametrize("dist", ["normal", "laplace", "t3"])
def test_mse_per_channel_never_worse_than_min_max(rng, dist):
    # (64, 512) weights: the default per-channel grid's bins (~3 %) are coarser than the int8
    # step near max; the histogram estimate chose ranges worse than min/max in 13-21 channels
    # and up to 14 % worse than the best candidate
    draw = {"normal": rng.standard_normal, "laplace": rng.laplace, "t3": rng.standard_t}[dist]
    w = (draw(3, size=(64, 512)) if dist == "t3" else draw(size=(64, 512))).astype(np.float32)
    kw = {"dtype": "qint8", "qscheme": "per_channel_symmetric", "ch_axis": 0}
    o, mm = nbqat.MSEObserver(**kw), nbqat.PerChannelMinMaxObserver(**kw)
    o(w)
    mm(w)
    x = w.astype(np.float64)
    got = _errors_of(x, o, *o.calculate_qparams())
    ref = _errors_of(x, mm, *mm.calculate_qparams())
    best = _candidate_errors(x, o).min(axis=0)
    assert (got <= ref).all()  # no channel worse than min/max
    assert (got <= best * 1.01).all()  # within 1 % of the exact best candidate
    assert got.sum() < 0.995 * ref.sum()


@pytest.mark.parametrize(
    ("dtype", "qscheme"), [("quint8", "per_tensor_affine"), ("qint8", "per_tensor_symmetric")]
)
def test_mse_per_tensor_is_the_exact_best_candidate(rng, dtype, qscheme):
    x = rng.laplace(size=3000).astype(np.float32)
    o = nbqat.MSEObserver(dtype=dtype, qscheme=qscheme)
    for part in np.array_split(x, 3):
        o(part)
    x64 = x.astype(np.float64)[None, :]
    got = _errors_of(x64, o, *o.calculate_qparams())
    cand = _candidate_errors(x64, o)[:, 0]
    assert got[0] <= cand[-1] and got[0] <= cand.min() * 1.01


def test_mse_on_data_already_on_the_min_max_grid_keeps_min_max(rng):
    # values on the int8 grid of their own min/max: min/max has error 0; any estimate from
    # the counts alone sees a spread-out histogram and clips
    codes = np.clip(np.rint(rng.standard_normal((4, 2000)) * 20), -127, 127)
    codes[:, 0] = 127
    w = (codes * np.float32(0.01)).astype(np.float32)
    kw = {"dtype": "qint8", "qscheme": "per_channel_symmetric"}
    o, mm = nbqat.MSEObserver(**kw), nbqat.PerChannelMinMaxObserver(**kw)
    o(w)
    mm(w)
    np.testing.assert_array_equal(o.calculate_qparams()[0], mm.calculate_qparams()[0])


def test_mse_exact_values_merge_and_give_up_like_one_observer(rng):
    kw = {"qscheme": "per_channel_affine", "ch_axis": 1, "max_exact": 90, "nonfinite": "ignore"}
    parts = [rng.standard_normal((n, 3)).astype(np.float32) for n in (40, 30, 30)]
    parts[1][0, 2] = np.nan  # channel 2 one value short: rows padded with +inf
    parts[0][1, 0] = -0.0
    one, a, b = (nbqat.MSEObserver(**kw) for _ in range(3))
    for p in parts[:2]:
        one(p)
    a(parts[0])
    b(parts[1])
    b.merge(a)
    assert one.state_dict()["exact_values"].shape == (3, 70)
    for k, v in one.state_dict().items():
        np.testing.assert_array_equal(b.state_dict()[k], v)
    v = one.exact_values
    assert np.isinf(v[2, -1]) and not (np.signbit(v) & (v == 0)).any()  # -0.0 stored as 0.0
    c = nbqat.MSEObserver(**kw)
    c.load_state_dict(one.state_dict())
    np.testing.assert_array_equal(c.calculate_qparams()[0], one.calculate_qparams()[0])
    one(parts[2])  # 100 > 90 values a channel: given up, the histogram estimate
    a2 = nbqat.MSEObserver(**kw)
    a2(parts[2])
    b.merge(a2)
    assert one.exact_values.shape == (3, 0)
    for k, v in one.state_dict().items():
        np.testing.assert_array_equal(b.state_dict()[k], v)
    st = c.state_dict()
    with pytest.raises(ValueError, match="exact_values"):
        c.load_state_dict({**st, "exact_values": st["exact_values"][:, ::-1].copy()})
    np.testing.assert_array_equal(c.state_dict()["exact_values"], st["exact_values"])
    old = {k: v for k, v in st.items() if k != "exact_values"}  # an older state: no values
    c.load_state_dict(old)
    assert c.exact_values.shape == (3, 0) and c.histogram.sum() == 209


def test_percentile_quantile_refuses_q_outside_0_1(rng):
    # quantile(nan) returned 0.0, quantile(1.5) the maximum and quantile(True) too, silently
    # (numpy.quantile raises); now refused before anything is computed
    o = nbqat.PercentileObserver()
    o(rng.standard_normal(1000).astype(np.float32))
    for q, exc in ((float("nan"), ValueError), (1.5, ValueError), (-0.1, ValueError),
                   (True, TypeError), ("0.5", TypeError)):  # fmt: skip
        with pytest.raises(exc, match="`q`"):
            o.quantile(q)
    assert o.quantile(np.float32(1.0)) == o.max_val
