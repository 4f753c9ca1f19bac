"""Per-variable input embedding and the variable selection network (VSN)."""

from __future__ import annotations

import numpy as np

from nbqat.kernels import nn_cpu
from nbqat.nn.layers.gating import GatedResidualNetwork
from nbqat.nn.params import Module, ModuleList, uniform_init


class VariableEmbedding(Module):
    """Real-valued input embedding: variable j -> ``x_j * weight[j] + bias[j]`` in R^d
    (Lim et al. sec. 4.1; one ``Linear(1, d)`` per variable, stacked).

    ``weight`` and ``bias`` are (num_vars, d), initialised ``U(-1, 1)`` (torch's Linear(1, d)).
    ``forward(x (..., m))`` returns the embedding twice: ``flat`` (N, m*d), row-major per step
    (the selection GRN's input), and ``pervar`` (m, N, d), variable-major (each variable's GRN
    input, contiguous); ``backward(dflat, dpervar)`` sums both gradients.

    Parameters
    ----------
    num_vars : int
        m, the number of input variables (size of the input's last axis).
    d : int
        Embedding size of each variable.
    """

    def __init__(self, num_vars: int, d: int) -> None:
        super().__init__()
        self.num_vars = int(num_vars)
        self.d = int(d)
        self.declare("weight", (self.num_vars, self.d), uniform_init(1.0))
        self.declare("bias", (self.num_vars, self.d), uniform_init(1.0))

    def forward(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Embed every variable of every row of ``x``.

        Parameters
        ----------
        x : ndarray (..., num_vars) float32 or float64
            Any leading shape (N rows in all); in the dtype of the parameters.

        Returns
        -------
        flat : ndarray (N, num_vars * d)
            Row ``n`` holds the m embeddings of row ``n`` one after the other.
        pervar : ndarray (num_vars, N, d)
            The same values, variable-major.
        """
        m, d = self.num_vars, self.d
        x2 = np.ascontiguousarray(x).reshape(-1, m)  # (N, m)
        n = x2.shape[0]
        flat = np.empty((n, m * d), dtype=x2.dtype)  # (N, m*d)
        pervar = np.empty((m, n, d), dtype=x2.dtype)  # (m, N, d)
        nn_cpu.embed_forward(x2, self.weight, self.bias, flat, pervar)
        self._cache = (x2, x.shape)
        return flat, pervar

    def backward(self, dflat: np.ndarray, dpervar: np.ndarray) -> np.ndarray:
        """Accumulate ``weight_grad`` / ``bias_grad`` from both outputs' gradients.

        Parameters
        ----------
        dflat : ndarray (N, num_vars * d)
            Gradient w.r.t. ``flat`` of the last :meth:`forward`.
        dpervar : ndarray (num_vars, N, d)
            Gradient w.r.t. ``pervar`` of the last :meth:`forward`.

        Returns
        -------
        ndarray (..., num_vars)
            ``dx``, the shape of the forward input (both paths summed).

        Raises
        ------
        RuntimeError
            When called before :meth:`forward`.
        """
        x2, shape = self._require_forward()
        dx = np.empty_like(x2)
        dw = np.empty_like(self.weight)
        db = np.empty_like(self.bias)
        nn_cpu.embed_backward(
            x2,
            self.weight,
            np.ascontiguousarray(dflat, dtype=x2.dtype),
            np.ascontiguousarray(dpervar, dtype=x2.dtype),
            dx,
            dw,
            db,
        )
        self.weight_grad += dw
        self.bias_grad += db
        return dx.reshape(shape)


class VariableSelectionNetwork(Module):
    """Variable selection network (Lim et al. sec. 4.2) including the input embedding.

    ``xi = embedding(x)``; ``v = softmax(flat_grn(flatten(xi), c))`` over the m variables;
    ``xi~_j = var_grns[j](xi_j)``; output ``sum_j v_j xi~_j``.

    Parameters
    ----------
    num_vars : int
        m, the number of input variables (>= 1).
    hidden_size : int
        d: embedding size, hidden size of every GRN and output size.
    context_size : int or None, default None
        Size of the static context fed to ``flat_grn`` (None for the static VSN).

    Notes
    -----
    ``flat_grn`` is ``GRN(m*d -> d -> m)`` with a Linear skip (m*d != m); each ``var_grns[j]``
    is ``GRN(d -> d -> d)`` with an identity skip. After forward, ``weights`` holds the selection
    weights (..., m).
    """

    def __init__(self, num_vars: int, hidden_size: int, context_size: int | None = None) -> None:
        super().__init__()
        self.num_vars = int(num_vars)
        self.hidden_size = int(hidden_size)
        m, d = self.num_vars, self.hidden_size
        self.embedding = VariableEmbedding(m, d)
        self.flat_grn = GatedResidualNetwork(m * d, d, m, context_size)
        self.var_grns = ModuleList([GatedResidualNetwork(d, d, d) for _ in range(m)])
        self.weights: np.ndarray | None = None

    def forward(self, x: np.ndarray, c: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Embed, weight and combine the m variables.

        Parameters
        ----------
        x : ndarray (B, num_vars) or (B, L, num_vars) float32 or float64
            The raw (real-valued) inputs; in the dtype of the parameters.
        c : ndarray (B, context_size), optional
            Static context of ``flat_grn``; required exactly when the VSN was built with
            ``context_size``.

        Returns
        -------
        output : ndarray (..., hidden_size)
            ``sum_j v_j xi~_j``, same leading shape as ``x``.
        weights : ndarray (..., num_vars)
            The selection weights ``v`` (softmax over the variables); also kept in
            ``self.weights``.

        Raises
        ------
        ValueError
            When ``c`` is given without ``context_size`` (or missing with it), or has the wrong
            shape.
        """
        m, d = self.num_vars, self.hidden_size
        lead = x.shape[:-1]
        flat, pervar = self.embedding.forward(x)  # (N, m*d), (m, N, d)
        n = flat.shape[0]
        logits = self.flat_grn.forward(flat.reshape(*lead, m * d), c)  # (..., m)
        v = np.empty((n, m), dtype=flat.dtype)  # (N, m)
        nn_cpu.softmax_forward(logits.reshape(n, m), v)
        xs = np.empty((m, n, d), dtype=flat.dtype)  # (m, N, d)
        for j in range(m):
            self.var_grns[j].forward(pervar[j], out=xs[j])
        out = np.empty((n, d), dtype=flat.dtype)  # (N, d)
        nn_cpu.vsn_combine_forward(v, xs, out)
        self._cache = (v, xs, lead)
        self.weights = v.reshape(*lead, m)
        return out.reshape(*lead, d), self.weights

    def backward(self, dy: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
        """Accumulate every sub-layer's gradients; return the input gradients.

        Parameters
        ----------
        dy : ndarray (..., hidden_size)
            Gradient w.r.t. ``output`` of the last :meth:`forward` (no gradient flows in through
            the returned selection weights).

        Returns
        -------
        dx : ndarray (..., num_vars)
            Gradient w.r.t. ``x``, its shape.
        dc : ndarray (B, context_size) or None
            Gradient w.r.t. the context; None without context.

        Raises
        ------
        RuntimeError
            When called before :meth:`forward`.
        """
        v, xs, lead = self._require_forward()
        m, d = self.num_vars, self.hidden_size
        n = v.shape[0]
        dy2 = np.ascontiguousarray(dy, dtype=v.dtype).reshape(n, d)
        dv = np.empty_like(v)
        dxs = np.empty_like(xs)
        nn_cpu.vsn_combine_backward(dy2, v, xs, dv, dxs)
        dlogits = np.empty_like(v)
        nn_cpu.softmax_backward(dv, v, dlogits)
        dflat, dc = self.flat_grn.backward(dlogits.reshape(*lead, m))
        dpervar = np.empty_like(xs)  # (m, N, d)
        for j in range(m):
            dpervar[j] = self.var_grns[j].backward(dxs[j])[0]
        dx = self.embedding.backward(dflat.reshape(n, m * d), dpervar)
        return dx, dc
