"""The Diebold-Mariano test of the main job's summary (``nbqat.train.metrics.diebold_mariano``).

Oracles: a slow, obvious re-implementation (explicit autocovariance loops, Bartlett weights,
the normal CDF from ``math.erf``), the test's size under the null hypothesis and its power
under an alternative, both by simulation with fixed seeds.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from nbqat.train.metrics import diebold_mariano


def _slow_dm(a, b, overlap):
    d = [float(x) - float(y) for x, y in zip(a, b)]
    n = len(d)
    mean = sum(d) / n
    lags = min(n - 1, max(overlap - 1, int(math.floor(4 * (n / 100) ** (2 / 9)))))

    def gamma(k):
        return sum((d[t] - mean) * (d[t - k] - mean) for t in range(k, n)) / n

    var = gamma(0) + 2 * sum((1 - k / (lags + 1)) * gamma(k) for k in range(1, lags + 1))
    dm = mean / math.sqrt(var / n)
    return dm, 2 * (1 - 0.5 * (1 + math.erf(abs(dm) / math.sqrt(2)))), lags


@pytest.mark.parametrize("n, overlap", [(30, 1), (216, 4), (500, 12)])
def test_matches_the_slow_formula(n, overlap):
    rng = np.random.default_rng(n)
    e = rng.standard_normal(n + 1)
    d = e[1:] + 0.6 * e[:-1] + 0.1  # MA(1): autocorrelated, as overlapping windows are
    b = rng.random(n)
    r = diebold_mariano(b + d, b, overlap)
    dm, p, lags = _slow_dm(b + d, b, overlap)
    assert r["lags"] == lags and r["n"] == n
    assert r["dm"] == pytest.approx(dm, rel=1e-9)
    assert r["p_value"] == pytest.approx(p, rel=1e-7, abs=1e-12)
    assert r["mean_diff"] == pytest.approx(np.mean(d), rel=1e-12)


def test_size_under_the_null_and_power_under_an_alternative():
    rng = np.random.default_rng(0)
    null = [
        diebold_mariano(rng.standard_normal(200), np.zeros(200))["p_value"] for _ in range(2000)
    ]
    rate = np.mean(np.array(null) < 0.05)
    assert 0.03 <= rate <= 0.08, rate  # nominal 5 % (Newey-West is slightly liberal)
    alt = diebold_mariano(rng.standard_normal(200) - 0.5, np.zeros(200))
    assert alt["dm"] < 0 and alt["p_value"] < 1e-3  # a has the smaller loss


def test_constant_differentials():
    x = np.arange(10.0)  # exact differences
    assert diebold_mariano(x, x) == {
        "dm": 0.0,
        "p_value": 1.0,
        "mean_diff": 0.0,
        "lags": 2,
        "n": 10,
    }
    r = diebold_mariano(x + 1, x)
    assert r["dm"] is None and r["p_value"] == 0.0 and r["mean_diff"] == pytest.approx(1.0)


@pytest.mark.parametrize(
    "a, b, needle",
    [(np.ones(3), np.ones(4), "same length"), (np.ones(1), np.ones(1), ">= 2"),
     (np.ones((2, 2)), np.ones((2, 2)), "1-D"), (np.array([1.0, np.nan]), np.ones(2), "finite")],
)  # fmt: skip
def test_bad_input_is_refused(a, b, needle):
    with pytest.raises(ValueError, match="loss_a and loss_b") as e:
        diebold_mariano(a, b)
    assert needle in str(e.value)
