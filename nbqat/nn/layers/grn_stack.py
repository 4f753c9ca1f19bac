"""m gated residual networks of one shape run as one batched computation (a VSN's per-variable
GRNs; the TFT's four static-context GRNs)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from nbqat.kernels import nn_cpu
from nbqat.nn.layers.gating import FOLD_MIN_ROWS_PER_OUTPUT, GatedResidualNetwork
from nbqat.nn.layers.linear import _ones
from nbqat.nn.params import stacked_view

#: The parameters a stack reads, by their path inside a GRN.
_PARAMS = {
    "fc1_w": ("fc1", "weight"),
    "fc1_b": ("fc1", "bias"),
    "fc2_w": ("fc2", "weight"),
    "fc2_b": ("fc2", "bias"),
    "glu_w": ("gate.glu.fc", "weight"),
    "glu_b": ("gate.glu.fc", "bias"),
    "ln_w": ("gate.norm", "weight"),
    "ln_b": ("gate.norm", "bias"),
}


def _sub(grn: GatedResidualNetwork, path: str) -> object:
    mod: object = grn
    for part in path.split("."):
        mod = getattr(mod, part)
    return mod


class GRNStack:
    """The bodies of m :class:`GatedResidualNetwork` s of one shape as one batched pass: what m
    calls of :meth:`GatedResidualNetwork.forward_projected` and
    :meth:`~GatedResidualNetwork.backward_projected` compute, bit for bit, in a fixed number of
    calls instead of about 25 per GRN.

    Each layer's arithmetic is the per-GRN path's: the matrix products are NumPy's ``matmul``
    over a leading axis of m (one BLAS call per GRN, the same call the 2-D product makes), the
    element passes are the grouped kernels of :mod:`nbqat.kernels.nn_cpu` (each group runs the
    per-layer kernel), and each GRN's dropout layer draws its own mask
    (:meth:`~nbqat.nn.Dropout.forward`). ``fc2`` is folded into the GLU exactly when a single
    GRN folds it. The parameters and gradients are read and accumulated through zero-copy
    views (:func:`~nbqat.nn.params.stacked_view`), so the GRNs keep their own parameters,
    names and checkpoint entries. ``tests/test_grn_stack.py`` checks the stack against the
    per-GRN path bit for bit. :meth:`forward_shared` runs the m GRNs, ``fc1`` included, on one
    shared input (the TFT's static contexts). The GRNs are assumed to share a dropout mode
    (:func:`~nbqat.nn.set_dropout` switches all): were some dropping and others not, none would
    fold ``fc2`` (the same function, rounded in another order than single GRNs would).

    Parameters
    ----------
    grns : sequence of GatedResidualNetwork
        Built without context and with ``input_size == output_size`` (an identity skip), of
        one ``hidden_size``, ``output_size``, ``fold_fc2`` and LayerNorm ``eps``, every Linear
        plain (:meth:`~nbqat.nn.Linear.is_plain`), parameters bound by one
        :class:`~nbqat.nn.params.ParameterBuffer` (:meth:`supports` says whether they are).

    Raises
    ------
    ValueError
        When :meth:`supports` is False for ``grns``.
    """

    def __init__(self, grns: Sequence[GatedResidualNetwork]) -> None:
        views = self._stacked(grns) if self._one_shape(grns) else None
        if views is None:
            raise ValueError("GRNStack: the GRNs are not of one plain, context-free shape")
        self.grns = list(grns)
        self._views: dict[str, np.ndarray] = views
        self._cache: tuple | None = None
        self._work: dict[str, np.ndarray] = {}
        self._shared: np.ndarray | None = None  # forward_shared's input

    def _buffer(self, name: str, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        """A work array kept across calls (no allocation, and no page faults on megabytes of
        fresh memory, in the steady state); valid until the next call that asks for ``name``."""
        a = self._work.get(name)
        if a is None or a.shape != shape or a.dtype != dtype:
            a = self._work[name] = np.empty(shape, dtype)
        return a

    @staticmethod
    def supports(grns: Sequence[GatedResidualNetwork]) -> bool:
        """Whether ``grns`` can run as one stack.

        Parameters
        ----------
        grns : sequence of GatedResidualNetwork
            The candidates, in order.

        Returns
        -------
        bool
            True when they meet the class's conditions (one plain, context-free shape; the
            parameters evenly spaced in one buffer); False for an empty sequence.
        """
        return GRNStack._one_shape(grns) and GRNStack._stacked(grns) is not None

    @staticmethod
    def _one_shape(grns: Sequence[GatedResidualNetwork]) -> bool:
        """The class's shape conditions, without the buffer's (:meth:`supports`)."""
        if not grns:
            return False
        g0 = grns[0]
        shape = (g0.hidden_size, g0.output_size, g0.fold_fc2, g0.gate.norm.eps)
        for g in grns:
            if (
                g.context_size is not None
                or g.input_size != g.output_size
                or (g.hidden_size, g.output_size, g.fold_fc2, g.gate.norm.eps) != shape
                or not (g.fc2.is_plain() and g.gate.glu.fc.is_plain())
                or (g.gate.glu.dropout is None) != (g0.gate.glu.dropout is None)
                or g.fc2.weight is None
            ):
                return False
        return True

    @staticmethod
    def _stacked(grns: Sequence[GatedResidualNetwork]) -> dict[str, np.ndarray] | None:
        views = {}
        for key, (path, name) in _PARAMS.items():
            for sfx in ("", "_grad"):
                view = stacked_view([getattr(_sub(g, path), name + sfx) for g in grns])
                if view is None:
                    return None
                views[key + sfx] = view
        return views

    @staticmethod
    def of(grns: Sequence[object], cached: GRNStack | None = None) -> GRNStack | None:
        """The stack of ``grns`` if it can run now: ``cached`` when it holds these GRNs, else
        a new one when they qualify (:meth:`supports`); None when they do not, or no longer
        (:meth:`ready`: a hook attached since, parameters rebound apart).

        Parameters
        ----------
        grns : sequence of modules
            The candidates (a caller's GRNs, in order; any other module gives None).
        cached : GRNStack, optional
            The stack the caller built before (kept when it holds the same GRNs).

        Returns
        -------
        GRNStack or None
        """
        grn_list = [g for g in grns if isinstance(g, GatedResidualNetwork)]
        if len(grn_list) != len(grns):
            return None
        if cached is None or cached.grns != grn_list:
            try:
                cached = GRNStack(grn_list)  # checks and stacks the views once
            except ValueError:  # not one plain, context-free shape in one buffer
                return None
        return cached if cached.ready() else None

    def ready(self) -> bool:
        """True when the stack can run now: every Linear still plain (no quantization hook
        attached since) and the parameters still evenly spaced in one buffer (the stacked
        views are rebuilt when the GRNs were rebound to another buffer).

        Returns
        -------
        bool
        """
        if not all(
            g.fc1.is_plain() and g.fc2.is_plain() and g.gate.glu.fc.is_plain() for g in self.grns
        ):
            return False
        v = self._views
        first, last = self.grns[0], self.grns[-1]
        if not v or not (
            np.shares_memory(v["fc1_w"][0], first.fc1.weight)
            and np.shares_memory(v["ln_b_grad"][-1], last.gate.norm.bias_grad)
        ):
            self._views = self._stacked(self.grns) or {}
        return bool(self._views)

    def views(self) -> dict[str, np.ndarray]:
        """The stacked (m, ...) views of the GRNs' parameters and gradients, by key
        (``fc1_w``, ``fc1_w_grad``, ``fc2_b``, ``glu_w``, ``ln_w``, ...); valid after
        :meth:`ready` returned True."""
        return self._views

    def forward(
        self, z: np.ndarray, skip: np.ndarray, bias: np.ndarray, out: np.ndarray
    ) -> np.ndarray:
        """``out[j] = grns[j].forward_projected(z[j], skip[j], bias=bias[j])``.

        Parameters
        ----------
        z : ndarray (m, N, hidden_size), C-contiguous
            Each GRN's ``fc1`` product without its bias; OVERWRITTEN with the pre-activation.
        skip : ndarray (m, N, output_size), C-contiguous
            The residuals.
        bias : ndarray (m, hidden_size)
            The bias added to ``z[j]`` before the ELU.
        out : ndarray (m, N, output_size), C-contiguous
            Written with the outputs.

        Returns
        -------
        ndarray
            ``out``.

        Raises
        ------
        ValueError
            When an array does not have its shape, is not C-contiguous or not in the
            parameters' dtype (checked before anything is written).
        """
        self._check(z, skip, bias, out)
        self._shared = None
        p, t = self._views, z.dtype
        m, n, _ = z.shape
        c = out.shape[2]
        eta2 = self._buffer("eta2", z.shape, t)
        nn_cpu.elu_forward_grouped(z, np.ascontiguousarray(bias, t), eta2)
        drops = [d for d in (g.gate.glu.dropout for g in self.grns) if d is not None]
        # the GRNs share a dropout mode (set_dropout sets all); were it mixed, none folds
        masks = drops if len(drops) == m and any(d.active() for d in drops) else []
        zg, x_glu, gbias, wf = self._projection(eta2, c, masks)
        g = self._buffer("g", (m, n, c), t)  # skip + GLU, the LayerNorm's input
        sig = self._buffer("sig", (m, n, c), t)
        nn_cpu.glu_forward_grouped(zg, np.ascontiguousarray(gbias, t), skip, g, sig)
        mean, rstd = self._buffer("mean", (m, n), t), self._buffer("rstd", (m, n), t)
        ln_w, ln_b = np.ascontiguousarray(p["ln_w"]), np.ascontiguousarray(p["ln_b"])
        eps = self.grns[0].gate.norm.eps
        nn_cpu.layernorm_forward_grouped(g, ln_w, ln_b, eps, out, mean, rstd)
        self._cache = (z, eta2, x_glu, zg, sig, g, mean, rstd, ln_w, wf, masks)
        return out

    def _check(self, z: np.ndarray, skip: np.ndarray, bias: np.ndarray, out: np.ndarray) -> None:
        """:meth:`forward`'s arrays have their shapes, the parameters' dtype and (but ``bias``)
        C-contiguity: else a ValueError naming the array."""
        g0 = self.grns[0]
        m, h, c = len(self.grns), g0.hidden_size, g0.output_size
        n = z.shape[1] if z.ndim == 3 else -1
        t = g0.fc2.weight.dtype
        for name, a, shape in (("z", z, (m, n, h)), ("skip", skip, (m, n, c)),
                               ("out", out, (m, n, c)), ("bias", bias, (m, h))):  # fmt: skip
            if a.shape != shape or a.dtype != t or (name != "bias" and not a.flags.c_contiguous):
                raise ValueError(
                    f"GRNStack.forward: {name} must be a C-contiguous {t} array of shape {shape}"
                    f" (m GRNs, N rows), got {a.dtype} {a.shape}"
                )

    def _projection(self, eta2: np.ndarray, c: int, masks: list) -> tuple:
        """The GLU's projection ``zg`` (m, N, 2C) of the ELU's output ``eta2``, its bias not
        added: ``fc2`` folded into the GLU's Linear exactly when a single GRN folds it (``wf``
        the folded weight), else ``fc2``, its bias and each GRN's dropout (``masks``: the
        layers, when dropping) first (``wf`` None). Returns ``(zg, x_glu, bias, wf)``,
        ``x_glu`` the GLU Linear's input."""
        p, t = self._views, eta2.dtype
        m, n, _ = eta2.shape
        zg = self._buffer("zg", (m, n, 2 * c), t)
        if self.grns[0].fold_fc2 and n >= FOLD_MIN_ROWS_PER_OUTPUT * c and not masks:
            wf = np.matmul(p["glu_w"], p["fc2_w"])  # (m, 2C, h): fc2 folded into the GLU
            bias = np.matmul(p["glu_w"], p["fc2_b"][..., None])[..., 0] + p["glu_b"]
            return np.matmul(eta2, wf.transpose(0, 2, 1), out=zg), eta2, bias, wf
        eta1 = np.matmul(
            eta2, p["fc2_w"].transpose(0, 2, 1), out=self._buffer("eta1", eta2.shape, t)
        )
        nn_cpu.bias_add_grouped(eta1, np.ascontiguousarray(p["fc2_b"]))
        x_glu = eta1
        if masks:  # each GRN's own mask (an inactive layer copies)
            x_glu = self._buffer("x_glu", eta2.shape, t)
            for j, d in enumerate(masks):
                d.forward(eta1[j], out=x_glu[j])
        return np.matmul(x_glu, p["glu_w"].transpose(0, 2, 1), out=zg), x_glu, p["glu_b"], None

    def backward(self, dy: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``grns[j].backward_projected(dy[j])`` for every j: accumulates the gradients of
        ``fc2``, the GLU's Linear and the LayerNorm (not ``fc1``'s).

        Parameters
        ----------
        dy : ndarray (m, N, output_size), C-contiguous
            Gradient w.r.t. the last :meth:`forward`'s output.

        Returns
        -------
        dz : ndarray (m, N, hidden_size)
            Gradient w.r.t. ``z`` (and the bias added to it, summed over rows).
        dskip : ndarray (m, N, output_size)
            Gradient w.r.t. ``skip``.

        Raises
        ------
        RuntimeError
            Before :meth:`forward`.
        ValueError
            When ``dy`` is not a C-contiguous array of the last output's shape and dtype.
        """
        if self._cache is None:
            raise RuntimeError("GRNStack.backward called before forward")
        z, eta2, x_glu, zg, sig, g, mean, rstd, ln_w, wf, drops = self._cache
        if dy.shape != g.shape or dy.dtype != g.dtype or not dy.flags.c_contiguous:
            raise ValueError(
                f"GRNStack.backward: dy must be a C-contiguous {g.dtype} array of the last "
                f"output's shape {g.shape}, got {dy.dtype} {dy.shape}"
            )
        p = self._views
        m, n, c = dy.shape
        ones = _ones(n, dy.dtype)
        nchunks = max(1, -(-n // nn_cpu.ROW_CHUNK))
        dw, db = np.empty((m, nchunks, c), dy.dtype), np.empty((m, nchunks, c), dy.dtype)
        ds = self._buffer("ds", g.shape, g.dtype)  # dskip: the LayerNorm's input gradient
        nn_cpu.layernorm_backward_grouped(dy, g, ln_w, mean, rstd, ds, dw, db)
        p["ln_w_grad"] += dw.sum(axis=1)
        p["ln_b_grad"] += db.sum(axis=1)
        dzg = self._buffer("dzg", zg.shape, zg.dtype)
        nn_cpu.glu_backward(ds.reshape(-1, c), zg.reshape(-1, 2 * c), sig.reshape(-1, c),
                            dzg.reshape(-1, 2 * c))  # fmt: skip
        if wf is not None:  # fc2 was folded into the GLU
            pz = np.matmul(dzg.transpose(0, 2, 1), eta2)  # (m, 2C, h)
            sg = np.matmul(ones, dzg)  # (m, 2C)
            p["glu_w_grad"] += (
                np.matmul(pz, p["fc2_w"].transpose(0, 2, 1))
                + sg[:, :, None] * p["fc2_b"][:, None, :]
            )
            p["glu_b_grad"] += sg
            glu_wt = p["glu_w"].transpose(0, 2, 1)
            p["fc2_w_grad"] += np.matmul(glu_wt, pz)
            p["fc2_b_grad"] += np.matmul(glu_wt, sg[..., None])[..., 0]
            deta2 = np.matmul(dzg, wf, out=self._buffer("deta2", z.shape, z.dtype))
        else:
            p["glu_w_grad"] += np.matmul(dzg.transpose(0, 2, 1), x_glu)
            p["glu_b_grad"] += np.matmul(ones, dzg)
            deta1 = np.matmul(dzg, p["glu_w"], out=self._buffer("deta1", z.shape, z.dtype))
            for j, d in enumerate(drops):  # the masks of the last forward (none unless dropping)
                d.backward(deta1[j], out=deta1[j])
            p["fc2_w_grad"] += np.matmul(deta1.transpose(0, 2, 1), eta2)
            p["fc2_b_grad"] += np.matmul(ones, deta1)
            deta2 = np.matmul(deta1, p["fc2_w"], out=self._buffer("deta2", z.shape, z.dtype))
        dz = self._buffer("dz", z.shape, z.dtype)
        nn_cpu.elu_backward(deta2.reshape(-1), z.reshape(-1), eta2.reshape(-1), dz.reshape(-1))
        return dz, ds

    def forward_shared(self, a: np.ndarray) -> np.ndarray:
        """``out[j] = grns[j].forward(a)``: the m GRNs on one input, ``fc1`` included (the
        TFT's four static-context GRNs on the static VSN's output).

        Parameters
        ----------
        a : ndarray (N, input_size)
            The shared input, in the parameters' dtype.

        Returns
        -------
        ndarray (m, N, output_size)
            A work array of the stack: valid until its next forward.

        Raises
        ------
        ValueError
            When ``a`` is not a 2-D array (N, input_size) in the parameters' dtype.
        """
        p = self._views
        m, d, t = len(self.grns), self.grns[0].input_size, self.grns[0].fc1.weight.dtype
        if not isinstance(a, np.ndarray) or a.ndim != 2 or a.shape[1] != d or a.dtype != t:
            raise ValueError(
                f"GRNStack.forward_shared: a must be a {t} array (N, {d}), got "
                f"{getattr(a, 'dtype', type(a))} {getattr(a, 'shape', '')}"
            )
        n = a.shape[0]
        a2 = np.ascontiguousarray(a)
        z = np.matmul(a2, p["fc1_w"].transpose(0, 2, 1), out=self._buffer("z_in", (m, n, d), t))
        skip = self._buffer("skip_in", (m, n, d), t)
        skip[...] = a2  # the identity skip of each GRN
        out = self.forward(z, skip, p["fc1_b"], self._buffer("out", (m, n, d), t))
        self._shared = a2
        return out

    def backward_shared(self, dy: np.ndarray) -> np.ndarray:
        """Backward of :meth:`forward_shared`: accumulates every GRN's gradients, ``fc1``'s
        included, and returns each GRN's input gradient (the caller sums them in its order).

        Parameters
        ----------
        dy : ndarray (m, N, output_size), C-contiguous
            Gradient w.r.t. each GRN's output.

        Returns
        -------
        ndarray (m, N, input_size)
            ``grns[j].backward(dy[j])[0]`` for every j.

        Raises
        ------
        RuntimeError
            Before :meth:`forward_shared`.
        """
        if self._cache is None or self._shared is None:
            raise RuntimeError("GRNStack.backward_shared called before forward_shared")
        p = self._views
        dz, dskip = self.backward(dy)
        p["fc1_w_grad"] += np.matmul(dz.transpose(0, 2, 1), self._shared)
        p["fc1_b_grad"] += np.matmul(_ones(dz.shape[1], dz.dtype), dz)
        da = np.matmul(dz, p["fc1_w"], out=self._buffer("da", dskip.shape, dskip.dtype))
        da += dskip
        return da
