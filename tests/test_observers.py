"""Observers (CPU kernels) against PyTorch 2.13 and the NumPy reference (tests/ref_observers.py)."""

from __future__ import annotations

import warnings

import numba
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from ref_observers import RefObserver, ref_batch_minmax, ref_channel_values, ref_qparams

import nbqat
from nbqat._validate import split_axis
from nbqat.kernels import observe_cpu as K
from nbqat.quantization import _observer_stats as S

KINDS = {
    "minmax": (nbqat.MinMaxObserver, "MinMaxObserver", False, False),
    "moving": (nbqat.MovingAverageMinMaxObserver, "MovingAverageMinMaxObserver", False, True),
    "perchannel": (nbqat.PerChannelMinMaxObserver, "PerChannelMinMaxObserver", True, False),
    "moving_perchannel": (
        nbqat.MovingAveragePerChannelMinMaxObserver,
        "MovingAveragePerChannelMinMaxObserver",
        True,
        True,
    ),
}
# nbqat dtype -> (torch dtype name, extra torch kwargs giving the same range)
TORCH_DTYPE = {
    "qint8": ("qint8", {}),
    "quint8": ("quint8", {}),
    "qint16": ("int16", {}),
    "qint32": ("qint32", {}),
    "qint4": ("qint8", {"quant_min": -8, "quant_max": 7}),
    "quint4": ("quint8", {"quant_min": 0, "quant_max": 15}),
}


def make_pair(torch, kind, *, dtype="quint8", sym=False, averaging_constant=0.25, **kw):
    """An nbqat observer and the torch observer of the same kind and configuration."""
    cls, tname, per_channel, moving = KINDS[kind]
    qs = ("per_channel_" if per_channel else "per_tensor_") + ("symmetric" if sym else "affine")
    ours_kw = dict(kw, dtype=dtype, qscheme=qs)
    tdt, textra = TORCH_DTYPE[dtype]
    theirs_kw = dict(kw, dtype=getattr(torch, tdt), qscheme=getattr(torch, qs))
    for k, v in textra.items():
        theirs_kw.setdefault(k, v)
    if moving:
        ours_kw["averaging_constant"] = averaging_constant
        theirs_kw["averaging_constant"] = averaging_constant
    tcls = getattr(torch.ao.quantization.observer, tname)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return cls(**ours_kw), tcls(**theirs_kw)


def feed(torch, ours, theirs, batches):
    for b in batches:
        assert ours(b) is b
        theirs(torch.from_numpy(np.ascontiguousarray(b)))


def assert_same_qparams(torch, ours, theirs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        s, z = ours.calculate_qparams()
        ts, tz = theirs.calculate_qparams()
    assert s.dtype == np.float32 and z.dtype == np.int32
    ts = ts.numpy().astype(np.float32)
    tz = tz.numpy()
    assert s.shape == ts.shape and z.shape == tz.shape
    both_nan = np.isnan(s) & np.isnan(ts)  # NaN sign/payload carries no meaning
    assert np.array_equal(s.view(np.int32)[~both_nan], ts.view(np.int32)[~both_nan]), (s, ts)
    assert np.array_equal(np.isnan(s), np.isnan(ts))
    assert np.array_equal(z.astype(np.int64), tz.astype(np.int64)), (z, tz)


def assert_same_state(ours, theirs):
    tmin = theirs.min_val.numpy()
    tmax = theirs.max_val.numpy()
    np.testing.assert_array_equal(ours.min_val, tmin)  # NaN == NaN here; -0 == +0
    np.testing.assert_array_equal(ours.max_val, tmax)


def batches_of(rng, shape, n=3, loc=0.0, scale=1.0):
    return [
        (rng.standard_normal(shape) * scale + loc + rng.standard_normal() * scale).astype(
            np.float32
        )
        for _ in range(n)
    ]


# ---------------------------------------------------------------------------------------------
# PyTorch oracle
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["minmax", "moving"])
@pytest.mark.parametrize("dtype", ["quint8", "qint8"])
@pytest.mark.parametrize("sym", [False, True])
@pytest.mark.parametrize("reduce_range", [False, True])
def test_per_tensor_matches_torch(torch, rng, kind, dtype, sym, reduce_range):
    if sym and reduce_range and dtype == "quint8":  # invalid in torch and in nbqat
        tcls = getattr(torch.ao.quantization.observer, KINDS[kind][1])
        with pytest.raises(NotImplementedError), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            tcls(dtype=torch.quint8, qscheme=torch.per_tensor_symmetric, reduce_range=True)
        with pytest.raises(ValueError, match="reduce_range"):
            KINDS[kind][0](dtype=dtype, qscheme="per_tensor_symmetric", reduce_range=True)
        return
    ours, theirs = make_pair(torch, kind, dtype=dtype, sym=sym, reduce_range=reduce_range)
    for scale in (1e-4, 1.0, 300.0):
        feed(torch, ours, theirs, batches_of(rng, (5, 7), n=3, scale=scale))
        assert_same_state(ours, theirs)
        assert_same_qparams(torch, ours, theirs)


@pytest.mark.parametrize("kind", ["perchannel", "moving_perchannel"])
@pytest.mark.parametrize("ch_axis", [0, 1, 2, -1, -3])
@pytest.mark.parametrize(("dtype", "sym"), [("quint8", False), ("qint8", True), ("qint8", False)])
def test_per_channel_matches_torch(torch, rng, kind, ch_axis, dtype, sym):
    ours, theirs = make_pair(torch, kind, dtype=dtype, sym=sym, ch_axis=ch_axis)
    feed(torch, ours, theirs, batches_of(rng, (3, 4, 5), n=4, scale=2.0))
    assert ours.min_val.shape == (np.moveaxis(np.empty((3, 4, 5)), ch_axis, 0).shape[0],)
    assert_same_state(ours, theirs)
    assert_same_qparams(torch, ours, theirs)


@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("wide", ["extremes", "normal x 6e37"])
def test_range_wider_than_float32_is_torch_on_the_data_halved(torch, rng, kind, wide):
    """``max - min`` overflows float32 (torch: scale inf): the qparams are torch's on the data
    scaled by 2**-1, the scale scaled back (bit for bit)."""
    if wide == "extremes":
        batches = [np.array([[-3e38, 3e38], [0.0, 1.0]], np.float32)]
    else:
        batches = [(rng.standard_normal((2, 500)) * 6e37).astype(np.float32) for _ in range(3)]
    kw = {"ch_axis": 1} if "channel" in kind else {}
    ours, theirs = make_pair(torch, kind, **kw)
    for b in batches:
        ours(b)
        theirs(torch.from_numpy(b * np.float32(0.5)))
    s, z = ours.calculate_qparams()
    ts, tz = theirs.calculate_qparams()
    np.testing.assert_array_equal(s, ts.numpy() * np.float32(2))
    np.testing.assert_array_equal(z, tz.numpy())
    assert np.isfinite(s).all()


@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize(
    "case", ["zeros", "constant", "negative_constant", "all_negative", "one", "all_positive"]
)
@pytest.mark.parametrize("sym", [False, True])
def test_edge_cases_match_torch(torch, rng, kind, case, sym):
    shape = (1, 1) if case == "one" else (4, 3)
    if case == "zeros":
        b = [np.zeros(shape, np.float32)]
    elif case == "constant":
        b = [np.full(shape, 0.37, np.float32)] * 2
    elif case == "negative_constant":
        b = [np.full(shape, -5.5, np.float32)]
    elif case == "all_negative":
        b = [-np.abs(x) - 1 for x in batches_of(rng, shape)]
    elif case == "one":
        b = [np.array([[1.7]], np.float32), np.array([[-0.3]], np.float32)]
    else:
        b = [np.abs(x) + 0.5 for x in batches_of(rng, shape)]
    dtype = "qint8" if sym else "quint8"
    ours, theirs = make_pair(torch, kind, dtype=dtype, sym=sym)
    feed(torch, ours, theirs, b)
    assert_same_qparams(torch, ours, theirs)


@pytest.mark.parametrize("kind", ["minmax", "perchannel"])
@pytest.mark.parametrize(
    ("dtype", "qmin", "qmax", "reduce_range"),
    [
        ("quint8", 0, 15, False),
        ("qint8", -8, 7, False),
        ("qint8", -127, 127, False),
        ("quint8", 0, 255, False),  # a custom range equal to the default: symmetric zp 127
        ("quint8", 0, 200, True),
        ("qint8", -100, 51, True),
        ("qint8", None, None, False),
    ],
)
@pytest.mark.parametrize("sym", [False, True])
def test_custom_ranges_match_torch(torch, rng, kind, dtype, qmin, qmax, reduce_range, sym):
    if sym and reduce_range and dtype == "quint8":  # invalid in torch and in nbqat
        with pytest.raises(ValueError, match="reduce_range"):
            make_pair(
                torch,
                kind,
                dtype=dtype,
                sym=sym,
                quant_min=qmin,
                quant_max=qmax,
                reduce_range=reduce_range,
            )
        return
    ours, theirs = make_pair(
        torch, kind, dtype=dtype, sym=sym, quant_min=qmin, quant_max=qmax, reduce_range=reduce_range
    )
    assert (ours.quant_min, ours.quant_max) == (theirs.quant_min, theirs.quant_max)
    feed(torch, ours, theirs, batches_of(rng, (6, 5), scale=3.0, loc=1.0))
    assert_same_qparams(torch, ours, theirs)


@pytest.mark.parametrize("dtype", ["qint4", "quint4", "qint16", "qint32"])
@pytest.mark.parametrize("sym", [False, True])
@pytest.mark.parametrize("kind", ["moving", "moving_perchannel"])
def test_other_dtypes_match_torch(torch, rng, dtype, sym, kind):
    ours, theirs = make_pair(torch, kind, dtype=dtype, sym=sym)
    assert (ours.quant_min, ours.quant_max) == (theirs.quant_min, theirs.quant_max)
    feed(torch, ours, theirs, batches_of(rng, (4, 6), scale=10.0))
    assert_same_qparams(torch, ours, theirs)


@pytest.mark.parametrize("kind", ["minmax", "moving", "perchannel", "moving_perchannel"])
def test_long_stream_moving_average_bit_exact(torch, rng, kind):
    """30 batches: the running float32 EMA must not drift by a single ulp from torch's."""
    kw = {"ch_axis": 1} if KINDS[kind][2] else {}
    ours, theirs = make_pair(torch, kind, averaging_constant=0.01, **kw)
    feed(torch, ours, theirs, batches_of(rng, (3, 8), n=30, scale=5.0))
    assert_same_state(ours, theirs)
    assert_same_qparams(torch, ours, theirs)


@pytest.mark.parametrize("dtype", [np.float16, np.float64])
@pytest.mark.parametrize("kind", ["moving", "moving_perchannel"])
def test_float16_float64_input_observed_as_float32(torch, rng, dtype, kind):
    ours, theirs = make_pair(torch, kind)
    bs = [(rng.standard_normal((5, 4)) * 1e3).astype(dtype) for _ in range(3)]
    bs[0][0, 0] = 1e-30 if dtype == np.float64 else 1e-3
    feed(torch, ours, theirs, bs)
    assert_same_state(ours, theirs)
    assert_same_qparams(torch, ours, theirs)


# ---------------------------------------------------------------------------------------------
# NumPy reference and kernels
# ---------------------------------------------------------------------------------------------
def test_qparams_match_reference_formula(rng):
    for _ in range(200):
        lo, hi = np.sort(rng.standard_normal(2).astype(np.float32) * 10 ** rng.uniform(-6, 4))
        for sym, dtype in [(False, "quint8"), (True, "qint8"), (True, "quint8")]:
            obs = nbqat.MinMaxObserver(
                dtype=dtype, qscheme=f"per_tensor_{'symmetric' if sym else 'affine'}"
            )
            obs(np.array([lo, hi], np.float32))
            s, z = obs.calculate_qparams()
            rs, rz = ref_qparams(
                lo, hi, obs.quant_min, obs.quant_max, sym, 128 if dtype == "quint8" else 0
            )
            assert s[0] == rs and z[0] == rz


@settings(max_examples=40, deadline=None)
@given(
    shape=st.lists(st.integers(1, 6), min_size=1, max_size=4),
    axis_seed=st.integers(0, 100),
    n_bad=st.integers(0, 3),
    seed=st.integers(0, 2**32 - 1),
)
def test_kernels_match_reference(shape, axis_seed, n_bad, seed):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape).astype(np.float32) * 4
    flat = x.reshape(-1)
    for i in rng.integers(0, flat.size, size=n_bad):
        flat[i] = rng.choice([np.nan, np.inf, -np.inf])
    flat[rng.integers(0, flat.size)] = -0.0
    axis = axis_seed % x.ndim
    for ax in (None, axis):
        stats = S.stats_cpu_tensor(x) if ax is None else S.stats_cpu_channel(x, ax)
        for c, vals in enumerate(ref_channel_values(x, ax)):
            mn, mx, nn, npi, nni = ref_batch_minmax(vals, "ignore")
            assert stats[0][c] == mn and stats[1][c] == mx
            assert (stats[2][c], stats[3][c], stats[4][c]) == (nn, npi, nni)


@pytest.mark.parametrize("n", [1, 2, K.CHUNK - 1, K.CHUNK, K.CHUNK + 1, 3 * K.CHUNK + 17])
def test_per_tensor_kernel_chunk_boundaries(rng, n):
    x = rng.standard_normal(n).astype(np.float32)
    for pos in {0, n // 2, n - 1}:
        y = x.copy()
        y[pos] = 99.0
        kmin, kmax = K.minmax_keys_1d(y.view(np.int32))
        assert S.decode([kmax])[0] == 99.0 and S.decode([kmin])[0] == y.min()
        y[pos] = np.nan
        assert S.stats_cpu_tensor(y)[2][0] == 1


@pytest.mark.parametrize(
    "shape_axis",
    [
        ((2, 5, K.ROW_MIN - 1), 1),
        ((2, 5, K.ROW_MIN), 1),
        ((K.OUTER_CHUNKS * 2 + 3, 7), 1),
        ((3, 1), 0),
        ((1, 9), 1),
        ((4, 3, 2, 5), 2),
    ],
)
def test_per_channel_kernel_paths(rng, shape_axis):
    shape, axis = shape_axis
    x = rng.standard_normal(shape).astype(np.float32)
    fmin, fmax, nn, _, _ = S.stats_cpu_channel(x, axis)
    other = tuple(i for i in range(x.ndim) if i != axis)
    np.testing.assert_array_equal(fmin, x.min(axis=other))
    np.testing.assert_array_equal(fmax, x.max(axis=other))
    assert not nn.any()
    # small inputs take the serial twin; the threaded kernel must give the same keys
    outer, c, inner = split_axis(x.shape, axis)
    b = x.reshape(-1).view(np.int32)
    for a, bb in zip(
        K.minmax_keys_3d(b, outer, c, inner), K.minmax_keys_3d_serial(b, outer, c, inner)
    ):
        np.testing.assert_array_equal(a, bb)


def test_results_do_not_depend_on_thread_count(rng):
    x = rng.standard_normal((130, 3, 40)).astype(np.float32)
    x[5, 1, 3] = -0.0
    x[7, 0, 0] = np.nan
    b = x.reshape(-1).view(np.int32)
    old = numba.get_num_threads()
    try:
        res = []
        for t in (1, old):
            numba.set_num_threads(t)
            out = list(K.minmax_keys_1d(b))
            for outer, c, inner in [(130, 3, 40), (390, 40, 1), (1, 130, 120)]:
                out += list(K.minmax_keys_3d(b, outer, c, inner))
                out.append(K.minmax_finite_3d(b, outer, c, inner))
            res.append([np.array(a) for a in out])
    finally:
        numba.set_num_threads(old)
    for a, b2 in zip(*res):
        assert np.array_equal(a, b2)


@pytest.mark.parametrize("kind", list(KINDS))
def test_non_contiguous_views_equal_contiguous(rng, kind):
    cls = KINDS[kind][0]
    base = rng.standard_normal((6, 8, 5)).astype(np.float32)
    views = [base.transpose(2, 0, 1), base[::-1, ::2], base[:, 1:7, ::-1], np.asfortranarray(base)]
    for v in views:
        a = cls(ch_axis=1) if KINDS[kind][2] else cls()
        b = cls(ch_axis=1) if KINDS[kind][2] else cls()
        a(v)
        b(np.ascontiguousarray(v))
        np.testing.assert_array_equal(a.min_val, b.min_val)
        np.testing.assert_array_equal(a.max_val, b.max_val)


def test_stream_matches_reference_observer(rng):
    for axis, moving in [(None, None), (None, 0.2), (1, None), (0, 0.05)]:
        ref = RefObserver(axis, moving)
        if axis is None:
            obs = nbqat.MovingAverageMinMaxObserver(moving) if moving else nbqat.MinMaxObserver()
        elif moving:
            obs = nbqat.MovingAveragePerChannelMinMaxObserver(moving, ch_axis=axis)
        else:
            obs = nbqat.PerChannelMinMaxObserver(ch_axis=axis)
        for b in batches_of(rng, (4, 5), n=6, scale=2.0):
            obs(b)
            ref.observe(b)
        np.testing.assert_array_equal(np.reshape(obs.min_val, -1), np.array(ref.min, np.float32))
        np.testing.assert_array_equal(np.reshape(obs.max_val, -1), np.array(ref.max, np.float32))


# ---------------------------------------------------------------------------------------------
# non-finite policy
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", list(KINDS))
def test_nonfinite_raise_counts_and_keeps_state(rng, kind):
    cls, _, per_channel, _ = KINDS[kind]
    obs = cls()
    good = rng.standard_normal((3, 4)).astype(np.float32)
    obs(good)
    before = obs.state_dict()
    bad = good.copy()
    bad[0, 0] = np.nan
    bad[1, 1] = np.nan
    bad[2, 2] = np.inf
    bad[0, 3] = -np.inf
    with pytest.raises(ValueError, match=r"2 NaN, 1 \+Inf and 1 -Inf"):
        obs(bad)
    after = obs.state_dict()
    for k in before:
        assert np.array_equal(before[k], after[k])


@pytest.mark.parametrize("cls", [nbqat.MinMaxObserver, nbqat.HistogramObserver])
def test_a_float64_past_the_float32_range_is_named_as_such(cls):
    """torch's x.to(float32) reads 1e39 as +Inf; the error counted '1 +Inf' in a batch with
    no infinity, with NumPy's overflow warning, and said nothing of why."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no 'overflow encountered in cast'
        with pytest.raises(ValueError, match=r"1 \+Inf and 0 -Inf values \(counted in float32"):
            cls()(np.array([1.0, 1e39]))
    with pytest.raises(ValueError, match=r"1 NaN, 0 \+Inf and 0 -Inf values; the observer"):
        cls()(np.array([1.0, np.nan]))


@pytest.mark.parametrize("kind", list(KINDS))
def test_nonfinite_ignore_skips_values(rng, kind):
    cls, _, per_channel, moving = KINDS[kind]
    obs = cls(nonfinite="ignore")
    ref = RefObserver(0 if per_channel else None, 0.25 if moving else None, "ignore")
    if moving:
        obs = cls(0.25, nonfinite="ignore")
    first = rng.standard_normal((3, 4)).astype(np.float32)
    first[0, :] = np.nan  # per channel: channel 0 never sees a finite value in batch 1
    for b in [first, *batches_of(rng, (3, 4), n=2)]:
        b = b.copy()
        b[1, 2] = np.inf
        b[2, 0] = np.nan
        obs(b)
        ref.observe(b)
    np.testing.assert_array_equal(np.reshape(obs.min_val, -1), np.array(ref.min, np.float32))
    np.testing.assert_array_equal(np.reshape(obs.max_val, -1), np.array(ref.max, np.float32))
    state = obs.state_dict()
    obs(np.full((3, 4), np.nan, np.float32))  # all-NaN batch: unchanged
    np.testing.assert_array_equal(obs.min_val, state["min_val"])
    np.testing.assert_array_equal(obs.max_val, state["max_val"])


def test_nonfinite_ignore_unseen_channel_gets_default_qparams():
    obs = nbqat.PerChannelMinMaxObserver(nonfinite="ignore")
    x = np.array([[np.nan, np.nan], [1.0, -2.0]], np.float32)
    obs(x)
    with pytest.warns(UserWarning, match="never saw a finite value"):
        s, z = obs.calculate_qparams()
    assert s[0] == 1.0 and z[0] == 0
    ref_s, ref_z = ref_qparams(-2.0, 1.0, 0, 255, False)
    assert s[1] == ref_s and z[1] == ref_z


@pytest.mark.parametrize("kind", list(KINDS))
def test_nonfinite_propagate_is_torch(torch, rng, kind):
    cls, tname, per_channel, moving = KINDS[kind]
    ours = cls(nonfinite="propagate")
    theirs = getattr(torch.ao.quantization.observer, tname)()
    bs = batches_of(rng, (3, 4), n=3)
    bs[1][0, 1] = np.inf
    bs[1][1, 0] = -np.inf
    bs[2][2, 2] = np.nan
    for i, b in enumerate(bs):
        ours(b)
        theirs(torch.from_numpy(b))
        assert_same_state(ours, theirs)
        if i == 2:
            with pytest.warns(RuntimeWarning, match="NaN"):
                ours.calculate_qparams()
        assert_same_qparams(torch, ours, theirs)


def test_uninitialized_warns_and_returns_defaults():
    for cls in (nbqat.MinMaxObserver, nbqat.PerChannelMinMaxObserver):
        with pytest.warns(UserWarning, match="must run observer"):
            s, z = cls().calculate_qparams()
        assert s.tolist() == [1.0] and z.tolist() == [0]
        assert s.dtype == np.float32 and z.dtype == np.int32


def test_empty_batch_is_skipped():
    obs = nbqat.MinMaxObserver()
    x = np.empty((0, 3), np.float32)
    assert obs(x) is x
    assert obs.min_val == np.inf and obs.max_val == -np.inf


# ---------------------------------------------------------------------------------------------
# merge, state_dict
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["minmax", "perchannel"])
def test_merge_minmax_is_exact(rng, kind):
    cls = KINDS[kind][0]
    bs = batches_of(rng, (3, 4), n=6, scale=3.0)
    whole, a, b = cls(), cls(), cls()
    for i, x in enumerate(bs):
        whole(x)
        (a if i % 2 else b)(x)
    assert a.merge(b) is a
    np.testing.assert_array_equal(a.min_val, whole.min_val)
    np.testing.assert_array_equal(a.max_val, whole.max_val)
    fresh = cls()
    fresh.merge(whole)
    np.testing.assert_array_equal(fresh.min_val, whole.min_val)


@pytest.mark.parametrize("kind", ["moving", "moving_perchannel"])
def test_merge_moving_average_is_mean(rng, kind):
    cls = KINDS[kind][0]
    a, b = cls(0.1), cls(0.1)
    for x in batches_of(rng, (3, 4), n=3):
        a(x)
    for x in batches_of(rng, (3, 4), n=2, scale=5.0):
        b(x)
    want_min = a.min_val + np.float32(0.5) * (b.min_val - a.min_val)
    want_max = a.max_val + np.float32(0.5) * (b.max_val - a.max_val)
    a.merge(b)
    np.testing.assert_array_equal(a.min_val, want_min)
    np.testing.assert_array_equal(a.max_val, want_max)
    a.merge(cls(0.1))  # unset side ignored
    np.testing.assert_array_equal(a.min_val, want_min)


def test_merge_rejects_mismatches(rng):
    with pytest.raises(TypeError, match="MinMaxObserver"):
        nbqat.MinMaxObserver().merge(nbqat.MovingAverageMinMaxObserver())
    with pytest.raises(ValueError, match="different configurations"):
        nbqat.MinMaxObserver().merge(nbqat.MinMaxObserver(dtype="qint8"))
    a, b = nbqat.PerChannelMinMaxObserver(), nbqat.PerChannelMinMaxObserver()
    a(np.ones((3, 2), np.float32))
    b(np.ones((4, 2), np.float32))
    with pytest.raises(ValueError, match="3 channels with 4"):
        a.merge(b)


@pytest.mark.parametrize("kind", list(KINDS))
def test_state_dict_roundtrip_and_torch_state(torch, rng, kind):
    ours, theirs = make_pair(torch, kind)
    feed(torch, ours, theirs, batches_of(rng, (3, 4)))
    sd = ours.state_dict()
    assert set(sd) == set(theirs.state_dict())
    fresh = KINDS[kind][0]()
    fresh.load_state_dict(sd)
    np.testing.assert_array_equal(fresh.min_val, ours.min_val)
    from_torch = KINDS[kind][0]()
    from_torch.load_state_dict({k: v.numpy() for k, v in theirs.state_dict().items()})
    assert_same_qparams(torch, from_torch, theirs)


def test_load_state_dict_errors_leave_state(rng):
    obs = nbqat.PerChannelMinMaxObserver()
    obs(rng.standard_normal((3, 2)).astype(np.float32))
    good = obs.state_dict()
    bad_cases = [
        ({"min_val": good["min_val"]}, KeyError, "max_val"),
        ({**good, "junk": 1}, ValueError, "unexpected"),
        ({**good, "min_val": np.zeros(2, np.float32)}, ValueError, "equal length"),
        ({**good, "min_val": np.zeros((3, 1), np.float32)}, ValueError, "1-D"),
        ({**good, "min_val": good["max_val"] + 1}, ValueError, "min_val > max_val"),
        ({**good, "eps": np.array([-1.0])}, ValueError, "eps"),
    ]
    for state, exc, msg in bad_cases:
        with pytest.raises(exc, match=msg):
            obs.load_state_dict(state)
        np.testing.assert_array_equal(obs.min_val, good["min_val"])
    pt = nbqat.MinMaxObserver()
    with pytest.raises(ValueError, match=r"shape \(\) or \(1,\)"):
        pt.load_state_dict({"min_val": np.zeros(2), "max_val": np.zeros(2)})


@pytest.mark.parametrize("policy", ["raise", "ignore"])
@pytest.mark.parametrize("bad", [(np.nan, 1.0), (-1.0, np.nan), (-np.inf, 1.0), (0.0, np.inf)])
def test_load_state_dict_keeps_the_nonfinite_policy(policy, bad):
    """An observer that never stores NaN / Inf does not load them either (its qparams would be
    NaN); the unset pair ``(+inf, -inf)`` of a fresh observer loads, and ``"propagate"`` (torch's
    behaviour) loads anything, with calculate_qparams' NaN warning."""
    obs = nbqat.MinMaxObserver(nonfinite=policy)
    obs(np.array([-1.0, 2.0], np.float32))
    with pytest.raises(ValueError, match=f"nonfinite='{policy}'"):
        obs.load_state_dict({"min_val": np.float32(bad[0]), "max_val": np.float32(bad[1])})
    assert (float(obs.min_val), float(obs.max_val)) == (-1.0, 2.0)  # unchanged
    obs.load_state_dict(nbqat.MinMaxObserver().state_dict())  # the unset pair
    assert (float(obs.min_val), float(obs.max_val)) == (np.inf, -np.inf)
    torch_like = nbqat.MinMaxObserver(nonfinite="propagate")
    torch_like.load_state_dict({"min_val": np.float32(bad[0]), "max_val": np.float32(bad[1])})
    if np.isnan(bad).any():
        with pytest.warns(RuntimeWarning, match="holds NaN"):
            assert np.isnan(torch_like.calculate_qparams()[0]).all()


@pytest.mark.parametrize("policy", ["raise", "ignore"])
@pytest.mark.parametrize("bad", [(np.nan, 1.0), (0.0, np.inf), (2.0, 1.0)])
def test_set_min_max_keeps_the_state_invariants(policy, bad):
    # set_min_max (the public setter) took NaN under nonfinite="raise" (the state then NaN for
    # good) and min > max (a bogus scale); now refused as load_state_dict refuses them
    obs = nbqat.PerChannelMinMaxObserver(nonfinite=policy)
    obs(np.array([[-1.0], [2.0]], np.float32))
    with pytest.raises(ValueError, match="set_min_max"):
        obs.set_min_max([bad[0], -3.0], [bad[1], 3.0])
    np.testing.assert_array_equal(obs.min_val, [-1.0, 2.0])  # unchanged
    obs.set_min_max([np.inf, -3.0], [-np.inf, 3.0])  # an unset channel is a valid state
    torch_like = nbqat.PerChannelMinMaxObserver(nonfinite="propagate")
    if not bad[0] > bad[1]:
        torch_like.set_min_max([bad[0]], [bad[1]])  # torch's behaviour: anything non-finite


# ---------------------------------------------------------------------------------------------
# bad input
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("ctor", "exc", "msg"),
    [
        (lambda: nbqat.MinMaxObserver(dtype="int7"), ValueError, "unknown dtype"),
        (lambda: nbqat.MinMaxObserver(qscheme="per_tensor_weird"), ValueError, "unknown qscheme"),
        (lambda: nbqat.MinMaxObserver(qscheme="per_channel_affine"), ValueError, "per_tensor"),
        (
            lambda: nbqat.PerChannelMinMaxObserver(qscheme="per_tensor_affine"),
            ValueError,
            "per_channel",
        ),
        (lambda: nbqat.MinMaxObserver(quant_min=1, quant_max=10), ValueError, "contain 0"),
        (lambda: nbqat.MinMaxObserver(quant_min=-10, quant_max=-1), ValueError, "contain 0"),
        (lambda: nbqat.MinMaxObserver(quant_min=0, quant_max=0), ValueError, "strictly less"),
        (lambda: nbqat.MinMaxObserver(quant_min=0), ValueError, "both"),
        (lambda: nbqat.MinMaxObserver(quant_min=0, quant_max=300), ValueError, "does not fit"),
        (lambda: nbqat.MinMaxObserver(quant_min=0.0, quant_max=10), TypeError, "quant_min"),
        (
            lambda: nbqat.MinMaxObserver(qscheme="per_tensor_symmetric", reduce_range=True),
            ValueError,
            "reduce_range",
        ),
        (lambda: nbqat.MovingAverageMinMaxObserver(0.0), ValueError, "averaging_constant"),
        (lambda: nbqat.MovingAverageMinMaxObserver(1.5), ValueError, "averaging_constant"),
        (lambda: nbqat.MinMaxObserver(eps=0.0), ValueError, "eps"),
        (lambda: nbqat.MinMaxObserver(nonfinite="skip"), ValueError, "nonfinite"),
        (lambda: nbqat.PerChannelMinMaxObserver(ch_axis=1.0), TypeError, "ch_axis"),
    ],
)
def test_bad_construction(ctor, exc, msg):
    with pytest.raises(exc, match=msg):
        ctor()


def test_torch_style_names_accepted():
    obs = nbqat.MinMaxObserver(dtype="torch.qint8", qscheme="torch.per_tensor_symmetric")
    assert obs.dtype == "qint8" and obs.qscheme == "per_tensor_symmetric"


def test_bad_input_leaves_state(rng):
    obs = nbqat.PerChannelMinMaxObserver(ch_axis=1)
    obs(rng.standard_normal((2, 3)).astype(np.float32))
    before = obs.state_dict()
    cases = [
        (np.ones((2, 3), np.int32), TypeError, "float16/float32/float64"),
        (None, TypeError, "must be an array"),
        ([["a", "b", "c"]], TypeError, "float16/float32/float64"),
        (np.ones((2, 4), np.float32), ValueError, "has seen 3"),
        (np.ones(3, np.float32), ValueError, "out of range"),
        (np.array(1.0, np.float32), ValueError, "ndim >= 1"),
        (np.ones((2, 3), np.complex64), TypeError, "astype"),
    ]
    for x, exc, msg in cases:
        with pytest.raises(exc, match=msg):
            obs(x)
        for k, v in obs.state_dict().items():
            assert np.array_equal(v, before[k])
    obs.reset_min_max_vals()
    obs(np.ones((2, 4), np.float32))  # after a reset the channel count is free again
    assert obs.min_val.shape == (4,)


def test_with_args_factory():
    f = nbqat.MinMaxObserver.with_args(dtype="qint8").with_args(qscheme="per_tensor_symmetric")
    a, b = f(), f()
    assert a is not b and a.dtype == "qint8" and a.qscheme == "per_tensor_symmetric"
    assert "with_args" in repr(f)


@pytest.mark.parametrize("cls", [nbqat.MinMaxObserver, nbqat.MovingAverageMinMaxObserver])
def test_merge_keeps_nan_of_a_propagate_observer_out(cls):
    # a "propagate" observer's NaN state merged into a "raise" one made its min/max NaN (a NaN
    # scale for good, the state nonfinite="raise" exists to prevent); now a ValueError
    ours, torch_like = cls(), cls(nonfinite="propagate")
    ours(np.array([1.0, 2.0], np.float32))
    torch_like(np.array([np.nan, 3.0], np.float32))
    with pytest.raises(ValueError, match="merge"):
        ours.merge(torch_like)
    assert (float(ours.min_val), float(ours.max_val)) == (1.0, 2.0)
    torch_like.merge(ours)  # the other way round: torch's behaviour, NaN stays NaN
    assert np.isnan(torch_like.min_val)


def test_moving_average_merge_of_far_apart_huge_values_is_their_mean():
    # a + 0.5 * (b - a) overflowed in b - a: min_val became +inf (an unset-looking half state)
    a, b = nbqat.MovingAverageMinMaxObserver(), nbqat.MovingAverageMinMaxObserver()
    a(np.array([-3e38, 1e38], np.float32))
    b(np.array([2e38, 3e38], np.float32))
    h = np.float32(0.5)
    want_min = np.float32((np.float64(a.min_val) + np.float64(b.min_val)) / 2)  # exact mean
    want_max = a.max_val + h * (b.max_val - a.max_val)  # no overflow: the float32 formula
    a.merge(b)
    assert (a.min_val, a.max_val) == (want_min, want_max)
    assert np.isfinite(a.calculate_qparams()[0]).all()


def test_an_eps_past_float32_is_refused_without_a_runtime_warning():
    # eps=1e39 was refused, after NumPy's "overflow encountered in cast" RuntimeWarning (an
    # error under -W error, ahead of the ValueError that names eps)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(ValueError, match="eps"):
            nbqat.MinMaxObserver(eps=1e39)
