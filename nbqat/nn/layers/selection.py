"""Per-variable input embedding and the variable selection network (VSN)."""

from __future__ import annotations

import numpy as np

from nbqat import _validate as V
from nbqat.kernels import nn_cpu
from nbqat.nn.init import uniform_init
from nbqat.nn.layers.gating import GatedResidualNetwork
from nbqat.nn.layers.grn_stack import GRNStack
from nbqat.nn.layers.linear import Linear, _ones
from nbqat.nn.params import Module, ModuleList, layer_size, read_only_view

_FLOATS = (np.dtype(np.float32), np.dtype(np.float64))  # the compiled passes' dtypes


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
        self.num_vars = layer_size("VariableEmbedding", "num_vars", num_vars)
        self.d = layer_size("VariableEmbedding", "d", d)
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

        Raises
        ------
        ValueError
            When ``x`` is not an array with last dimension ``num_vars`` (another last
            dimension was reshaped into rows of ``num_vars``).
        TypeError
            When ``x`` is neither float32 nor float64 (an integer ``x`` was embedded in
            integers), naming the fix ``x.astype(np.float32)``; before anything is cached.
        """
        m, d = self.num_vars, self.d
        if not isinstance(x, np.ndarray) or x.ndim < 1 or x.shape[-1] != m:
            raise ValueError(
                f"VariableEmbedding: x must be a float32/float64 array (..., {m}), got "
                f"{getattr(x, 'shape', type(x))} {getattr(x, 'dtype', '')}"
            )
        V.check_float_array(x, "x", _FLOATS)  # integer, bool, float16: TypeError, the cast
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
        ValueError
            When ``dflat`` or ``dpervar`` does not have its output's shape (the compiled pass
            indexes by the forward's N: a smaller array was read out of bounds).
        """
        x2, shape = self._require_forward()
        m, d, n = self.num_vars, self.d, x2.shape[0]
        dflat = self._grad_in(dflat, (n, m * d), x2.dtype, "dflat")
        dpervar = self._grad_in(dpervar, (m, n, d), x2.dtype, "dpervar")
        dx = np.empty_like(x2)
        dw = np.empty_like(self.weight)
        db = np.empty_like(self.bias)
        nn_cpu.embed_backward(x2, self.weight, dflat, dpervar, dx, dw, db)
        np.add(self.weight_grad, dw, out=self.weight_grad)
        np.add(self.bias_grad, db, out=self.bias_grad)
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
    fold_embedding : bool, default True
        Compute the first projections of the embedded inputs without materialising them (see
        Notes); False always runs every Linear on the embeddings (same function).

    Notes
    -----
    ``flat_grn`` is ``GRN(m*d -> d -> m)`` with a Linear skip (m*d != m); each ``var_grns[j]``
    is ``GRN(d -> d -> d)`` with an identity skip. After forward, ``weights`` holds the selection
    weights (..., m).

    Folded embedding: the embedding of variable j is affine in one scalar, ``x_j w_j + b_j``, so
    a Linear on it is too: ``fc1_j(xi_j) = x_j (W w_j) + (W b_j + bias)``, and ``flat_grn``'s
    ``fc1`` and ``skip`` reduce to (N, m) x (m, d) and (N, m) x (m, m) products. These first
    projections then cost O(N m d) instead of O(N m d^2) forward and backward (gradients:
    ``dW = (dz^T x_j) w_j^T + (dz^T 1) b_j^T``, and the embedding's from ``W^T dz^T x_j``); the
    rest of each GRN is unchanged. The result is the same function, rounded in another order.
    It applies when none of those Linears has a quantization hook (a fake-quantized input is no
    longer affine in ``x_j``) or a replaced ``forward`` (the int8 model's integer matmul);
    otherwise, or with ``fold_embedding=False``, the embeddings are materialised and every
    Linear runs as usual. The folded path calls neither ``embedding.forward`` nor
    ``var_grns[j].forward``: it runs the m per-variable GRNs as one
    :class:`~nbqat.nn.layers.grn_stack.GRNStack` (bit for bit m calls of
    :meth:`GatedResidualNetwork.forward_projected`), so code that replaces those needs
    ``fold_embedding=False``.
    """

    FOLDS = ("fold_embedding",)

    def __init__(
        self,
        num_vars: int,
        hidden_size: int,
        context_size: int | None = None,
        fold_embedding: bool = True,
    ) -> None:
        super().__init__()
        self.num_vars = layer_size("VariableSelectionNetwork", "num_vars", num_vars)
        self.hidden_size = layer_size("VariableSelectionNetwork", "hidden_size", hidden_size)
        self.fold_embedding = bool(fold_embedding)
        m, d = self.num_vars, self.hidden_size
        self.embedding = VariableEmbedding(m, d)
        self.flat_grn = GatedResidualNetwork(m * d, d, m, context_size)
        self.var_grns = ModuleList([GatedResidualNetwork(d, d, d) for _ in range(m)])
        self.weights: np.ndarray | None = None
        self._stack: GRNStack | None = None

    def forward(self, x: np.ndarray, c: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Embed, weight and combine the m variables.

        Parameters
        ----------
        x : ndarray (B, num_vars) or (B, L, num_vars) float32 or float64
            The raw (real-valued) inputs; cast to the dtype of the parameters.
        c : ndarray (B, context_size), optional
            Static context of ``flat_grn``; required exactly when the VSN was built with
            ``context_size``.

        Returns
        -------
        output : ndarray (..., hidden_size)
            ``sum_j v_j xi~_j``, same leading shape as ``x``.
        weights : ndarray (..., num_vars)
            The selection weights ``v`` (softmax over the variables); also kept in
            ``self.weights``. Read-only: a view of what :meth:`backward` reads.

        Raises
        ------
        ValueError
            When ``x`` is not an array with last dimension ``num_vars``; when ``c`` is given
            without ``context_size`` (or missing with it), or has the wrong shape.
        TypeError
            When ``x`` is an array neither float32 nor float64 (integer, bool: it was a
            ValueError) or ``c`` is not floating point; before anything is cached.
        """
        m, d = self.num_vars, self.hidden_size
        if not isinstance(x, np.ndarray) or x.ndim < 1 or x.shape[-1] != m:
            raise ValueError(
                f"x must be a float32/float64 array (..., {m}), got "
                f"{getattr(x, 'shape', type(x))} {getattr(x, 'dtype', '')}"
            )
        V.check_float_array(x, "x", _FLOATS)
        # the context before any sub-layer runs (refused by flat_grn after the embedding had
        # cached this x, the next backward mixed two forwards)
        self.flat_grn.check_context(x, c)
        x = np.asarray(x, dtype=self.embedding.weight.dtype)  # both paths in the parameters'
        lead = x.shape[:-1]
        if self._foldable():
            logits, xs, fold = self._folded_forward(x, c)
        else:
            flat, pervar = self.embedding.forward(x)  # (N, m*d), (m, N, d)
            logits = self.flat_grn.forward(flat.reshape(*lead, m * d), c)  # (..., m)
            xs = np.empty_like(pervar)  # (m, N, d)
            for j in range(m):
                self.var_grns[j].forward(pervar[j], out=xs[j])
            fold = None
        n = xs.shape[1]
        v = np.empty((n, m), dtype=xs.dtype)  # (N, m)
        nn_cpu.softmax_forward(logits.reshape(n, m), v)
        out = np.empty((n, d), dtype=xs.dtype)  # (N, d)
        nn_cpu.vsn_combine_forward(v, xs, out)
        self._cache = (v, xs, lead, fold)
        self.weights = read_only_view(v.reshape(*lead, m))  # v is backward's: no edits
        return out.reshape(*lead, d), self.weights

    def _foldable(self) -> bool:
        fc = [self.flat_grn.fc1, getattr(self.flat_grn, "skip", None)]
        fc += [g.fc1 for g in self.var_grns]
        if not (self.fold_embedding and all(isinstance(f, Linear) and f.is_plain() for f in fc)):
            return False
        self._stack = GRNStack.of(list(self.var_grns), self._stack)  # None: the per-GRN path
        return self._stack is not None

    def _folded_forward(self, x: np.ndarray, c: np.ndarray | None) -> tuple:
        """Forward with the embedding folded into the first projections (class Notes)."""
        m, d = self.num_vars, self.hidden_size
        lead = x.shape[:-1]
        w, b = self.embedding.weight, self.embedding.bias  # (m, d)
        x2 = np.ascontiguousarray(x, dtype=w.dtype).reshape(-1, m)  # (N, m)
        n = x2.shape[0]
        fg = self.flat_grn
        w1 = fg.fc1.weight.reshape(d, m, d)  # (h, m, d): column block j acts on xi_j
        ws = fg.skip.weight.reshape(m, m, d)  # (m_out, m, d)
        a_flat = np.einsum("hjk,jk->jh", w1, w)  # (m, h)
        s_flat = np.einsum("ojk,jk->jo", ws, w)  # (m, m_out)
        z = (x2 @ a_flat).reshape(*lead, d)  # fc1(flat) without its constant part
        skip = x2 @ s_flat  # (N, m)
        skip += fg.skip.bias + np.einsum("ojk,jk->o", ws, b)
        bias = fg.fc1.bias + np.einsum("hjk,jk->h", w1, b)
        logits = fg.forward_projected(z, skip.reshape(*lead, m), c, bias=bias)  # (..., m)
        stack = self._stack
        assert stack is not None  # _foldable built it
        p = stack.views()  # the var GRNs' parameters, stacked (m, ...)
        a_var = np.matmul(p["fc1_w"], w[..., None])[..., 0]  # (m, h): fc1_j.weight @ w[j]
        pervar = np.empty((m, n, d), dtype=x2.dtype)  # (m, N, d)
        zs = np.empty((m, n, d), dtype=x2.dtype)  # (m, N, h)
        nn_cpu.embed_var_forward(x2, w, b, a_var, pervar, zs)
        xs = np.empty_like(pervar)  # (m, N, d)
        stack.forward(zs, pervar, p["fc1_b"] + np.matmul(p["fc1_w"], b[..., None])[..., 0], xs)
        return logits, xs, (x2, x.shape, x.dtype, a_flat, s_flat, a_var)

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
        ValueError
            When ``dy`` does not have the last output's shape (a transposed (L, B, d) ``dy``
            of as many rows would pair its rows with the wrong inputs).
        """
        v, xs, lead, fold = self._require_forward()
        m, d = self.num_vars, self.hidden_size
        n = v.shape[0]
        dy2 = self._grad_in(dy, (*lead, d), v.dtype).reshape(n, d)
        dv = np.empty_like(v)
        dxs = np.empty_like(xs)
        nn_cpu.vsn_combine_backward(dy2, v, xs, dv, dxs)
        dlogits = np.empty_like(v)
        nn_cpu.softmax_backward(dv, v, dlogits)
        if fold is not None:
            return self._folded_backward(dlogits.reshape(*lead, m), dxs, fold)
        dflat, dc = self.flat_grn.backward(dlogits.reshape(*lead, m))
        dpervar = np.empty_like(xs)  # (m, N, d)
        for j in range(m):
            dpervar[j] = self.var_grns[j].backward(dxs[j])[0]
        dx = self.embedding.backward(dflat.reshape(n, m * d), dpervar)
        return dx, dc

    def _folded_backward(
        self, dlogits: np.ndarray, dxs: np.ndarray, fold: tuple
    ) -> tuple[np.ndarray, np.ndarray | None]:
        """Backward of :meth:`_folded_forward`: the folded Linears' and the embedding's
        gradients from the GRNs' projection gradients (class Notes)."""
        x2, shape, x_dtype, a_flat, s_flat, a_var = fold
        m, d = self.num_vars, self.hidden_size
        n = x2.shape[0]
        w, b = self.embedding.weight, self.embedding.bias  # (m, d)
        fg = self.flat_grn
        w1 = fg.fc1.weight.reshape(d, m, d)
        ws = fg.skip.weight.reshape(m, m, d)
        dz, dskip, dc = fg.backward_projected(dlogits)
        dz2, ds2 = dz.reshape(n, d), dskip.reshape(n, m)
        ones = _ones(n, x2.dtype)
        gz, gz0 = dz2.T @ x2, ones @ dz2  # (h, m), (h,)
        gs, gs0 = ds2.T @ x2, ones @ ds2  # (m_out, m), (m_out,)
        fc1_wg = fg.fc1.weight_grad.reshape(d, m, d)  # views of the flat gradient buffer
        fc1_wg += gz[:, :, None] * w + gz0[:, None, None] * b
        np.add(fg.fc1.bias_grad, gz0, out=fg.fc1.bias_grad)
        skip_wg = fg.skip.weight_grad.reshape(m, m, d)
        skip_wg += gs[:, :, None] * w + gs0[:, None, None] * b
        np.add(fg.skip.bias_grad, gs0, out=fg.skip.bias_grad)
        dw = np.einsum("hjk,hj->jk", w1, gz) + np.einsum("ojk,oj->jk", ws, gs)  # (m, d)
        db = np.einsum("hjk,h->jk", w1, gz0) + np.einsum("ojk,o->jk", ws, gs0)
        dx = dz2 @ a_flat.T  # (N, m)
        dx += ds2 @ s_flat.T
        stack = self._stack
        assert stack is not None
        p = stack.views()
        dzs, dss = stack.backward(dxs)  # (m, N, h), (m, N, d)
        gz, gz0 = np.empty((m, d), x2.dtype), np.empty((m, d), x2.dtype)
        gs, gs0 = np.empty((m, d), x2.dtype), np.empty((m, d), x2.dtype)
        nn_cpu.embed_vars_backward(x2, w, a_var, dzs, dss, gz, gz0, gs, gs0, dx)
        p["fc1_w_grad"] += gz[:, :, None] * w[:, None, :] + gz0[:, :, None] * b[:, None, :]
        p["fc1_b_grad"] += gz0
        fc1_wt = p["fc1_w"].transpose(0, 2, 1)  # (m, d, h)
        dw += np.matmul(fc1_wt, gz[..., None])[..., 0] + gs
        db += np.matmul(fc1_wt, gz0[..., None])[..., 0] + gs0
        np.add(self.embedding.weight_grad, dw, out=self.embedding.weight_grad)
        np.add(self.embedding.bias_grad, db, out=self.embedding.bias_grad)
        return dx.reshape(shape).astype(x_dtype, copy=False), dc
