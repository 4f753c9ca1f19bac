"""Interpretable multi-head attention (Lim et al. sec. 4.4)."""

from __future__ import annotations

from typing import Any

import numpy as np

from nbqat import _validate as V
from nbqat.kernels import attention_cpu as _k
from nbqat.nn.layers.linear import Linear, hook_backward
from nbqat.nn.params import Module, layer_size, read_only_view


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
    ``attention_probs`` holds the (unquantized) per-head probabilities (B, H, tq, T) and
    ``attention_weights`` their mean over the heads (B, tq, T), read-only (views of what
    backward reads).

    Parameters
    ----------
    d_model : int
        d, the size of the last axis of the queries, keys/values and the output.
    n_head : int
        H >= 1, the number of heads; ``d_model`` must be divisible by it (d_h = d / H).

    Raises
    ------
    ValueError
        When ``d_model`` or ``n_head`` is not a positive int, or ``d_model % n_head != 0``.
    """

    def __init__(self, d_model: int, n_head: int) -> None:
        super().__init__()
        d_model = layer_size("InterpretableMultiHeadAttention", "d_model", d_model)
        n_head = layer_size("InterpretableMultiHeadAttention", "n_head", n_head)
        if d_model % n_head != 0:
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
        self.attention_weights: np.ndarray | None = None

    def forward(self, query: np.ndarray, key_value: np.ndarray, offset: int) -> np.ndarray:
        """Masked interpretable attention of ``query`` over ``key_value``.

        Parameters
        ----------
        query : ndarray (B, tq, d_model) float32 or float64
            The query sequence; in the dtype of the parameters.
        key_value : ndarray (B, T, d_model)
            The sequence that gives both the keys and the values.
        offset : int
            Absolute position (>= 0) of the first query in the key sequence: query ``i``
            attends to keys ``j <= offset + i`` (itself included).

        Returns
        -------
        ndarray (B, tq, d_model)
            The attention output; ``attention_probs`` is set to the per-head probabilities
            (B, H, tq, T).

        Raises
        ------
        ValueError
            When ``offset`` is not an integer >= 0 (a query would see no key), or ``query``
            and ``key_value`` are not 3-D with one batch size and last dimension ``d_model``
            (checked first: a ``key_value`` refused by ``k_proj`` after ``q_proj`` had cached
            the new query left the next backward mixing two forwards).
        TypeError
            When ``query`` or ``key_value`` is not floating point (checked first too).
        """
        if isinstance(offset, bool) or not isinstance(offset, int | np.integer) or offset < 0:
            raise ValueError(
                f"offset must be an int >= 0 (query i attends to keys j <= offset + i), got "
                f"{offset!r}"
            )
        offset = int(offset)
        query = V.check_float_array(query, "query")
        key_value = V.check_float_array(key_value, "key_value")
        qs, ks = np.shape(query), np.shape(key_value)
        d = self.d_model
        if len(qs) != 3 or len(ks) != 3 or qs[0] != ks[0] or qs[2] != d or ks[2] != d:
            raise ValueError(
                f"query and key_value must be (B, tq, {d}) and (B, T, {d}) (d_model = {d}) "
                f"with one B, got {qs} and {ks}"
            )
        q = self.q_proj.forward(query)  # (B, tq, d)
        k = self.k_proj.forward(key_value)  # (B, T, d)
        v = self.v_proj.forward(key_value)  # (B, T, d_h)
        nb, tq, _ = q.shape
        tk = k.shape[1]
        nh, dh = self.n_head, self.d_head
        qh = np.ascontiguousarray(q.reshape(nb, tq, nh, dh).transpose(0, 2, 1, 3))  # (B,H,tq,dh)
        kt = np.ascontiguousarray(k.reshape(nb, tk, nh, dh).transpose(0, 2, 3, 1))  # (B,H,dh,T)
        p = np.empty((nb, nh, tq, tk), dtype=q.dtype)  # (B, H, tq, T)
        _k.attn_scores(qh, kt, offset, p)
        np.exp(p, out=p)
        _k.attn_normalize(p, offset)
        ctx = None
        pq = p
        if self.attention_fake_quant is not None:
            pq = np.ascontiguousarray(self.attention_fake_quant.forward(p), dtype=p.dtype)
            ctx = self.attention_fake_quant.ctx
        vt = np.ascontiguousarray(v.transpose(0, 2, 1))  # (B, d_h, T)
        pbar = np.empty((nb, tq, tk), dtype=q.dtype)  # (B, tq, T) heads averaged
        o = np.empty((nb, tq, self.d_head), dtype=q.dtype)  # (B, tq, d_h)
        _k.attn_apply_forward(pq, vt, pbar, o)
        # read-only views where backward reads the array itself (an edit would change dq, dk)
        self.attention_probs = read_only_view(p)
        # heads averaged (unquantized): the forecaster's interpretable attention weights
        self.attention_weights = read_only_view(pbar) if pq is p else p.mean(axis=1)
        self._cache = (qh, kt, vt, p, pbar, ctx, offset)
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
        qh, kt, vt, p, pbar, ctx, offset = self._require_forward()
        nb, nh, tq, tk = p.shape
        do = np.ascontiguousarray(self.out_proj.backward(dy), dtype=p.dtype)  # (B, tq, d_h)
        dp = np.empty_like(p)
        dvt = np.empty_like(vt)  # (B, d_h, T)
        _k.attn_apply_backward(do, pbar, vt, dp, dvt)
        if self.attention_fake_quant is not None:
            dp = hook_backward(self.attention_fake_quant, dp, ctx)
            dp = np.ascontiguousarray(dp, dtype=p.dtype)
        dqh = np.empty_like(qh)
        dkt = np.empty_like(kt)
        _k.attn_probs_backward(dp, p, qh, kt, offset, dqh, dkt)
        dq = dqh.transpose(0, 2, 1, 3).reshape(nb, tq, self.d_model)  # (B, tq, d)
        dk = dkt.transpose(0, 3, 1, 2).reshape(nb, tk, self.d_model)  # (B, T, d)
        dquery = self.q_proj.backward(dq)
        dkv = self.k_proj.backward(dk)
        dkv += self.v_proj.backward(dvt.transpose(0, 2, 1))
        return dquery, dkv
