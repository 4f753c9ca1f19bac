"""The ridge-baseline oracle: ``numpy.linalg.lstsq`` on the augmented least-squares system
``[[X, 1], [sqrt(lam) I, 0]] [beta; b] = [[y], [0]]`` (ridge with an unpenalised intercept,
solved by an SVD, not by the normal equations ``nbqat.train.baselines`` uses); a window's row
of ``X`` written out as ``[historical, future, static]`` flattened (not ``flatten_window``).
"""

from __future__ import annotations

import numpy as np


def ridge_lstsq(x, y, lam):
    """``(coef (nf, tau), intercept (tau,))`` of ridge ``lam`` on rows ``x`` (n, nf), float64
    targets ``y`` (n, tau), by lstsq of the augmented system."""
    n, nf = x.shape
    a = np.block([[x, np.ones((n, 1))], [np.sqrt(lam) * np.eye(nf), np.zeros((nf, 1))]])
    rhs = np.vstack([y.astype(np.float64), np.zeros((nf, y.shape[1]))])
    sol = np.linalg.lstsq(a, rhs, rcond=None)[0]
    return sol[:nf], sol[nf]


def _rows(split):
    s, h, f, y = split.batch()
    return np.concatenate([h.reshape(len(h), -1), f.reshape(len(f), -1), s], axis=1), y


def ridge_oracle(train, lam):
    """Ridge ``lam`` fitted on the windows of ``train`` (``batch()`` -> s, h, f, y).

    Returns ``(mean, residuals)``: ``mean(split)`` the (n, tau) float64 point forecast of a
    split's windows in scaled units, ``residuals`` the training targets minus the fit (n, tau).
    """
    x, y = _rows(train)
    x = x.astype(float)
    coef, b = ridge_lstsq(x, y, lam)

    def mean(split):
        return _rows(split)[0] @ coef + b

    return mean, y - (x @ coef + b)
