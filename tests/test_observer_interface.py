"""The observers' public interfaces: torch's constructor signatures (written once in
nbqat.quantization._observer_args), the state interface of FakeQuantize's fused path (set_min_max,
symmetric_zero_point) and the counting kernels at block, chunk and bin-edge boundaries."""

from __future__ import annotations

import inspect
import warnings

import numba
import numpy as np
import pytest

import nbqat
from nbqat.kernels import histogram_cpu as hk
from nbqat.kernels import keygrid_cpu as kg
from nbqat.quantization._observer_stats import decode

# nbqat class -> torch class name; nbqat's extra arguments (not in torch's signature)
CLASSES = [
    (nbqat.MinMaxObserver, "MinMaxObserver"),
    (nbqat.MovingAverageMinMaxObserver, "MovingAverageMinMaxObserver"),
    (nbqat.PerChannelMinMaxObserver, "PerChannelMinMaxObserver"),
    (nbqat.MovingAveragePerChannelMinMaxObserver, "MovingAveragePerChannelMinMaxObserver"),
    (nbqat.HistogramObserver, "HistogramObserver"),
]
NBQAT_ONLY = {"nonfinite", "upsample_rate"}


def _norm(v):
    return str(v).removeprefix("torch.") if not isinstance(v, (bool, int, float)) else v


@pytest.mark.parametrize(("cls", "tname"), CLASSES)
def test_signature_follows_torch(torch, cls, tname):
    ours = inspect.signature(cls).parameters
    theirs = inspect.signature(getattr(torch.ao.quantization.observer, tname)).parameters
    shared = [n for n in ours if n not in NBQAT_ONLY]
    assert shared == [n for n in theirs if n in ours]  # torch's names, in torch's order
    for name in shared:
        assert _norm(ours[name].default) == _norm(theirs[name].default), name
    assert all(p.kind is p.POSITIONAL_OR_KEYWORD for p in ours.values())
    assert list(inspect.signature(cls()).parameters) == ["x"]  # an instance: obs(x)


def test_positional_and_keyword_arguments_bind_alike(rng):
    a = nbqat.MovingAveragePerChannelMinMaxObserver(0.5, 1, "qint8", "per_channel_symmetric")
    b = nbqat.MovingAveragePerChannelMinMaxObserver(
        averaging_constant=0.5, ch_axis=1, dtype="qint8", qscheme="per_channel_symmetric"
    )
    x = rng.standard_normal((3, 4)).astype(np.float32)
    for obs in (a, b):
        obs(x)
        obs(2 * x)
    for u, v in zip(a.calculate_qparams(), b.calculate_qparams()):
        np.testing.assert_array_equal(u, v)
    assert (a.averaging_constant, a.ch_axis, a.dtype) == (0.5, 1, "qint8")


@pytest.mark.parametrize(
    ("call", "msg"),
    [
        (lambda: nbqat.MinMaxObserver(foo=1), "unexpected keyword"),
        (lambda: nbqat.MinMaxObserver("quint8", dtype="qint8"), "multiple values"),
        (lambda: nbqat.MinMaxObserver(*["quint8"] * 8), "too many positional"),
        (lambda: nbqat.PercentileObserver(percentile=99.0, bins=3), "unexpected keyword"),
    ],
)
def test_bad_arguments_name_the_signature(call, msg):
    with pytest.raises(TypeError, match=msg) as info:
        call()
    assert "the signature is" in str(info.value)


@pytest.mark.parametrize("per_channel", [False, True])
def test_set_min_max_is_the_state_torch_sees(torch, rng, per_channel):
    """State written through set_min_max gives torch's qparams for the same min/max."""
    if per_channel:
        ours = nbqat.PerChannelMinMaxObserver(dtype="qint8", qscheme="per_channel_affine")
        theirs = torch.ao.quantization.PerChannelMinMaxObserver(
            dtype=torch.qint8, qscheme=torch.per_channel_affine
        )
        mn = -np.abs(rng.standard_normal(5)).astype(np.float32)
        mx = np.abs(rng.standard_normal(5)).astype(np.float32)
    else:
        ours = nbqat.MinMaxObserver(dtype="quint8")
        theirs = torch.ao.quantization.MinMaxObserver(dtype=torch.quint8)
        mn, mx = np.float32(-0.7), np.float32(3.1)
    ours.set_min_max(mn, mx)
    theirs.min_val = torch.tensor(mn)
    theirs.max_val = torch.tensor(mx)
    assert ours.min_val.dtype == np.float32 and ours.min_val.shape == np.shape(mn)
    s, z = ours.calculate_qparams()
    ts, tz = theirs.calculate_qparams()
    np.testing.assert_array_equal(s, ts.numpy().reshape(-1))
    np.testing.assert_array_equal(z, tz.numpy().reshape(-1))


def test_set_min_max_rejects_shapes_and_keeps_state():
    obs = nbqat.PerChannelMinMaxObserver()
    obs.set_min_max([-1.0, -2.0], [1.0, 2.0])
    for mn, mx in [([-1.0], [1.0, 2.0]), ([[-1.0, -2.0]], [[1.0, 2.0]]), (-1.0, 1.0)]:
        with pytest.raises(ValueError, match="set_min_max"):
            obs.set_min_max(mn, mx)
        np.testing.assert_array_equal(obs.min_val, [-1.0, -2.0])
    with pytest.raises(ValueError, match=r"shape \(\) or \(1,\)"):
        nbqat.MinMaxObserver().set_min_max([0.0, 1.0], [1.0, 2.0])


@pytest.mark.parametrize(
    ("dtype", "custom"),
    [
        ("qint8", None),
        ("quint8", None),
        ("quint8", (0, 127)),
        ("quint8", (0, 15)),
        ("qint8", (-8, 7)),
    ],
)
def test_symmetric_zero_point_is_torchs(torch, dtype, custom):
    kw = {} if custom is None else {"quant_min": custom[0], "quant_max": custom[1]}
    ours = nbqat.MinMaxObserver(dtype=dtype, qscheme="per_tensor_symmetric", **kw)
    theirs = torch.ao.quantization.MinMaxObserver(
        dtype=getattr(torch, dtype), qscheme=torch.per_tensor_symmetric, **kw
    )
    x = np.linspace(-2.0, 3.0, 11, dtype=np.float32)
    theirs(torch.from_numpy(x))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tz = int(theirs.calculate_qparams()[1][0])
    assert ours.symmetric_zero_point() == tz


def _edge_data(rng, lo, hi, bins, n):
    """Every bin edge, its float32 neighbours, the range ends, NaN/outside values and random
    fill up to ``n`` elements (shuffled)."""
    edges = (lo + np.arange(bins + 1) * ((np.float64(hi) - lo) / bins)).astype(np.float32)
    special = np.concatenate(
        [
            np.float32([lo, hi, np.nan, lo - 1, hi + 1]),
            edges,
            np.nextafter(edges, np.float32(np.inf)),
            np.nextafter(edges, np.float32(-np.inf)),
        ]
    )[:n]
    fill = rng.uniform(lo, hi, n - special.size).astype(np.float32)
    x = np.concatenate([special, fill])
    rng.shuffle(x)
    return x


@pytest.mark.parametrize(
    ("n", "bins", "lo", "hi"),
    [
        (hk.BLOCK * 2 + 3, 2048, -3.25, 4.5),  # several blocks and an unaligned tail
        (hk.CHUNK + 7, 13, -1e-3, 2e-3),  # a second chunk (the int32 rows are flushed)
        (hk.CHUNK * 3 + 1, 2049, 10.0, 1e4),  # several parallel rows
    ],
)
def test_counting_at_bin_edges_equals_torch_histc(torch, rng, n, bins, lo, hi):
    lo32, hi32 = np.float32(lo), np.float32(hi)
    x = _edge_data(rng, lo32, hi32, bins, n)
    ref = torch.histc(torch.from_numpy(np.nan_to_num(x, nan=hi + 1)), bins, lo, hi).numpy()
    np.testing.assert_array_equal(hk.histc_counts(x, lo32, hi32, bins, False), ref)
    kmin, kmax, counts = hk.minmax_histc(x, x.view(np.int32), lo32, hi32, bins)
    np.testing.assert_array_equal(counts, ref)
    assert decode([kmin])[0] == np.nanmin(x)  # the (positive) NaN's key lies above +Inf's
    assert kmax == np.float32(np.nan).view(np.int32)
    old = numba.get_num_threads()
    try:
        numba.set_num_threads(1)
        one = hk.histc_counts(x, lo32, hi32, bins, False)
    finally:
        numba.set_num_threads(old)
    np.testing.assert_array_equal(one, ref)


def _numpy_key_counts(x, shift):
    """Slow obvious reference: the order key of every finite value, shifted, counted."""
    w = x.reshape(-1).view(np.int32).astype(np.int64)
    k = np.where(w >= 0, w, w ^ 0x7FFFFFFF)[np.isfinite(x.reshape(-1))]
    return np.bincount((k >> shift) + (1 << (31 - shift)), minlength=1 << (32 - shift))


@pytest.mark.parametrize("n", [kg.BLOCK - 1, kg.BLOCK * 3 + 5, hk.CHUNK * 2 + 9])
def test_key_grid_counts_blocks_and_rows(rng, n):
    x = (rng.standard_normal(n) * 10.0 ** rng.integers(-30, 30, n)).astype(np.float32)
    x[rng.integers(0, n, 5)] = [np.nan, np.inf, -np.inf, -0.0, 0.0]
    np.testing.assert_array_equal(kg.key_counts(x.view(np.int32), 20), _numpy_key_counts(x, 20))


@pytest.mark.parametrize(("shape", "axis"), [((3, 5, 700), 1), ((2, 4100), 0), ((9, 6), 1)])
def test_key_grid_counts_per_channel(rng, shape, axis):
    x = rng.standard_normal(shape).astype(np.float32)
    x.reshape(-1)[::97] = np.nan
    outer = int(np.prod(shape[:axis]))
    inner = int(np.prod(shape[axis + 1 :]))
    got = kg.key_counts_channel(x.reshape(-1).view(np.int32), outer, shape[axis], inner, 22)
    for c in range(shape[axis]):
        np.testing.assert_array_equal(got[c], _numpy_key_counts(np.take(x, c, axis=axis), 22))


OBSERVERS = [
    lambda: nbqat.MinMaxObserver(),
    lambda: nbqat.PerChannelMinMaxObserver(ch_axis=1),
    lambda: nbqat.HistogramObserver(bins=64),
    lambda: nbqat.PercentileObserver(percentile=99.0),
    lambda: nbqat.MSEObserver(qscheme="per_channel_symmetric", dtype="qint8"),
]


@pytest.mark.parametrize("make", OBSERVERS)
def test_array_likes_are_observed_as_numpy(torch, rng, make):
    """A torch CPU tensor or a nested list is observed as np.asarray(x) and returned itself."""
    x = rng.standard_normal((6, 5)).astype(np.float32)
    ref, tensor_obs, list_obs = make(), make(), make()
    ref(x)
    t = torch.from_numpy(x)
    assert tensor_obs(t) is t
    rows = x.tolist()
    assert list_obs(rows) is rows  # float64 values, observed as float32 (torch's x.to(float32))
    for obs in (tensor_obs, list_obs):
        for a, b in zip(obs.calculate_qparams(), ref.calculate_qparams()):
            np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("make", OBSERVERS)
def test_tensor_requiring_grad_is_refused_and_state_kept(torch, rng, make):
    obs = make()
    obs(rng.standard_normal((6, 5)).astype(np.float32))
    before = obs.state_dict()
    with pytest.raises(TypeError, match="detach"):
        obs(torch.ones((6, 5), requires_grad=True))
    for k, v in obs.state_dict().items():
        np.testing.assert_array_equal(v, before[k])
