"""Interpretable multi-head attention (Lim et al. sec. 4.4)."""

from __future__ import annotations

from typing import Any

import numpy as np

from nbqat.kernels import nn_cpu
from nbqat.nn.layers.linear import Linear
from nbqat.nn.params import Module


class InterpretableMultiHeadAttention(Module):
    """Multi-head attention with one value projection shared by all heads and averaged heads.

    ``A_h = softmax(Q_h K_h^T / sqrt(d_h) + M)``, ``out = W_H((1/H) sum_h A_h V)`` with
    ``Q = q_proj(query)`` (H heads of d_h = d / H columns each, i.e. per-head query projections
    concatenated), ``K = k_proj(key_value)`` likewise, ``V = v_proj(key_value)`` (d -> d_h,
    shared), ``W_H = out_proj`` (d_h -> d). All four are :class:`Linear` with bias.

    Mask: query i sits at absolute position ``offset + i`` of the key sequence and attends to
    keys ``j <= offset + i`` -- it SEES ITSELF (Lim et al.'s decoder mask, unlike
    pytorch-forecasting's default that also hides the current step). Masked probabilities are
    exactly 0 and get zero gradient.

    ``attention_fake_quant`` (optional hook) is applied to the probabilities (B, H, tq, T)
    before they multiply V; softmax backward uses the unquantized probabilities. After forward,
    ``attention_probs`` holds the (unquantized) per-head probabilities (B, H, tq, T).

    Parameters
    ----------
    d_model : int
        d, the size of the last axis of the queries, keys/values and the output.
    n_head : int
        H >= 1, the number of heads; ``d_model`` must be divisible by it (d_h = d / H).

    Raises
    ------
    ValueError
        When ``n_head < 1`` or ``d_model % n_head != 0``.
    """

    def __init__(self, d_model: int, n_head: int) -> None:
        super().__init__()
        d_model, n_head = int(d_model), int(n_head)
        if n_head < 1 or d_model % n_head != 0:
            raise ValueError(
                f"hidden size {d_model} must be divisible by the number of heads {n_head}"
            )
        self.d_model = d_model
        self.n_head = n_head
        self.d_head = d_model // n_head
        self.q_proj = Linear(d_model, d_model)
        self.k_proj = Linear(d_model, d_model)
        self.v_proj = Linear(d_model, self.d_head)
        self.out_proj = Linear(self.d_head, d_model)
        self.attention_fake_quant: Any = None
        self.attention_probs: np.ndarray | None = None

    def forward(self, query: np.ndarray, key_value: np.ndarray, offset: int) -> np.ndarray:
        """Masked interpretable attention of ``query`` over ``key_value``.

        Parameters
        ----------
        query : ndarray (B, tq, d_model) float32 or float64
            The query sequence; in the dtype of the parameters.
        key_value : ndarray (B, T, d_model)
            The sequence that gives both the keys and the values.
        offset : int
            Absolute position of the first query in the key sequence: query ``i`` attends to
            keys ``j <= offset + i`` (itself included).

        Returns
        -------
        ndarray (B, tq, d_model)
            The attention output; ``attention_probs`` is set to the per-head probabilities
            (B, H, tq, T).
        """
        q = self.q_proj.forward(query)  # (B, tq, d)
        k = self.k_proj.forward(key_value)  # (B, T, d)
        v = self.v_proj.forward(key_value)  # (B, T, d_h)
        nb, tq, _ = q.shape
        tk = k.shape[1]
        p = np.empty((nb, self.n_head, tq, tk), dtype=q.dtype)  # (B, H, tq, T)
        nn_cpu.attn_probs_forward(q, k, self.n_head, int(offset), p)
        ctx = None
        pq = p
        if self.attention_fake_quant is not None:
            pq = np.ascontiguousarray(self.attention_fake_quant.forward(p), dtype=p.dtype)
            ctx = self.attention_fake_quant.ctx
        o = np.empty((nb, tq, self.d_head), dtype=q.dtype)  # (B, tq, d_h)
        nn_cpu.attn_apply_forward(pq, v, o)
        self.attention_probs = p
        self._cache = (q, k, v, p, pq, ctx, int(offset))
        return self.out_proj.forward(o)

    def backward(self, dy: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Accumulate the projections' gradients and return the input gradients.

        Parameters
        ----------
        dy : ndarray (B, tq, d_model)
            Gradient w.r.t. the output of the last :meth:`forward`.

        Returns
        -------
        dquery : ndarray (B, tq, d_model)
            Gradient w.r.t. ``query``.
        dkey_value : ndarray (B, T, d_model)
            Gradient w.r.t. ``key_value`` (the key and value paths' gradients summed).

        Raises
        ------
        RuntimeError
            When called before :meth:`forward`.
        """
        q, k, v, p, pq, ctx, offset = self._require_forward()
        do = np.ascontiguousarray(self.out_proj.backward(dy), dtype=q.dtype)  # (B, tq, d_h)
        dp = np.empty_like(p)
        dv = np.empty_like(v)
        nn_cpu.attn_apply_backward(do, pq, v, dp, dv)
        if self.attention_fake_quant is not None:
            dp = np.ascontiguousarray(self.attention_fake_quant.backward(dp, ctx), dtype=q.dtype)
        dq = np.empty_like(q)
        dk = np.empty_like(k)
        nn_cpu.attn_probs_backward(dp, p, q, k, offset, dq, dk)
        dquery = self.q_proj.backward(dq)
        dkv = self.k_proj.backward(dk)
        dkv += self.v_proj.backward(dv)
        return dquery, dkv
