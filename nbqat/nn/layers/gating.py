"""Gating layers of the TFT: gate-add-norm and the gated residual network (GRN); the GLU
itself is in :mod:`nbqat.nn.layers.glu` (importable from here too)."""

from __future__ import annotations

import numpy as np

from nbqat import _validate as V
from nbqat.nn.layers.activations import ELU
from nbqat.nn.layers.glu import GatedLinearUnit, sigmoid
from nbqat.nn.layers.linear import Linear, _ones
from nbqat.nn.layers.norm import LayerNorm
from nbqat.nn.params import Module, layer_size

__all__ = [
    "FOLD_MIN_ROWS_PER_OUTPUT",
    "GateAddNorm",
    "GatedLinearUnit",
    "GatedResidualNetwork",
    "sigmoid",
]


def _check_out_first(out: np.ndarray | None, x: np.ndarray, c: int, first: object) -> None:
    """``out`` checked as the final LayerNorm would, before any sub-layer runs: refused only
    there, the sub-layers would keep this call's caches and the LayerNorm the last one's (a
    backward mixing two forwards). The result's dtype is that of ``x`` times the first
    matmul's weight (``first``: that Linear, or an array); a layer without a float ``weight``
    (the int8 model's QuantizedLinear) leaves the dtype to the LayerNorm."""
    if out is None:
        return
    w = first if isinstance(first, np.ndarray) else getattr(first, "weight", None)
    if w is None:
        dtype = getattr(out, "dtype", None)
    else:
        dtype = np.result_type(x.dtype, w.dtype)
    V.check_out(out, (*x.shape[:-1], c), dtype, "LayerNorm out", contiguous=True)


class GateAddNorm(Module):
    """``LayerNorm(skip + GLU(x))`` (Lim et al. eqs. 2, 4 and the gates after the LSTM,
    the attention and the position-wise GRN).

    Parameters
    ----------
    input_size : int
        Size of the last axis of ``x`` (the GLU's input).
    output_size : int
        Size of the last axis of ``skip`` and of the output (the GLU's output and the
        LayerNorm's ``normalized_shape``).
    """

    def __init__(self, input_size: int, output_size: int) -> None:
        super().__init__()
        self.glu = GatedLinearUnit(input_size, output_size)
        self.norm = LayerNorm(output_size)

    def forward(self, x: np.ndarray, skip: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        """``LayerNorm(skip + GLU(x))``.

        Parameters
        ----------
        x : ndarray (..., input_size) float32 or float64
            Input of the GLU; in the dtype of the parameters.
        skip : ndarray (..., output_size)
            The residual, same leading shape as ``x``.
        out : ndarray (..., output_size), optional
            A C-contiguous array to write the result into (a new array when None); checked
            before anything runs (TypeError / ValueError naming it).

        Returns
        -------
        ndarray (..., output_size)
            The gated, normalised output (``out`` when given).

        Raises
        ------
        ValueError
            When ``skip`` does not have the GLU output's shape.
        """
        _check_out_first(out, x, self.norm.normalized_shape, self.glu.fc)
        return self.norm.forward(self.glu.forward(x, skip), out=out)

    def forward_projected(
        self, z: np.ndarray, skip: np.ndarray, bias: np.ndarray, out: np.ndarray | None = None
    ) -> np.ndarray:
        """``LayerNorm(skip + GLU)`` from the GLU's projection ``z`` (see
        :meth:`GatedLinearUnit.forward_projected`); pair with :meth:`backward_projected`.

        Parameters
        ----------
        z : ndarray (..., 2 * output_size), C-contiguous
            The GLU's projection without bias; overwritten.
        skip : ndarray (..., output_size)
            The residual.
        bias : ndarray (2 * output_size,)
            The projection's bias.
        out : ndarray (..., output_size), optional
            As in :meth:`forward`.

        Returns
        -------
        ndarray (..., output_size)

        Raises
        ------
        ValueError
            When ``z`` or ``bias`` is malformed (see
            :meth:`GatedLinearUnit.forward_projected`) or ``skip`` does not have the GLU
            output's shape.
        """
        _check_out_first(out, z, self.norm.normalized_shape, z)
        return self.norm.forward(self.glu.forward_projected(z, skip, bias), out=out)

    def backward(self, dy: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Accumulate the GLU's and the LayerNorm's gradients; return the input gradients.

        Parameters
        ----------
        dy : ndarray (..., output_size)
            Gradient w.r.t. ``LayerNorm(skip + GLU(x))`` of the last :meth:`forward`.

        Returns
        -------
        dx : ndarray (..., input_size)
            Gradient w.r.t. ``x``.
        dskip : ndarray (..., output_size)
            Gradient w.r.t. ``skip``.

        Raises
        ------
        RuntimeError
            When called before :meth:`forward`.
        """
        ds = self.norm.backward(dy)
        return self.glu.backward(ds), ds

    def backward_projected(self, dy: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Backward of :meth:`forward_projected`: the LayerNorm's gradients are accumulated,
        the GLU projection's are not.

        Parameters
        ----------
        dy : ndarray (..., output_size)
            Gradient w.r.t. the normalised output of the last :meth:`forward_projected`.

        Returns
        -------
        dz : ndarray (..., 2 * output_size)
            Gradient w.r.t. the GLU's projection.
        dskip : ndarray (..., output_size)
            Gradient w.r.t. ``skip``.

        Raises
        ------
        RuntimeError
            When called before a forward.
        """
        ds = self.norm.backward(dy)
        return self.glu.backward_projected(ds), ds


#: A GRN folds ``fc2`` into its GLU (see :class:`GatedResidualNetwork`) from this many rows per
#: GLU output column on (the break-even is 2).
FOLD_MIN_ROWS_PER_OUTPUT = 4


class GatedResidualNetwork(Module):
    """Gated residual network with optional static context (Lim et al. eqs. 2-4).

    ``eta2 = ELU(fc1(a) + context(c))`` (context: Linear without bias), ``eta1 = fc2(eta2)``,
    ``GRN(a, c) = LayerNorm(skip(a) + GLU(eta1))``; ``skip`` is the identity when
    ``input_size == output_size`` and a :class:`Linear` otherwise (no interpolation, unlike
    pytorch-forecasting). Dropout, when the TFT attaches it, sits at the GLU's input
    (``gate.glu.dropout``, on ``eta1``), as in the TFT paper.

    Parameters
    ----------
    input_size : int
        Size of the last axis of ``a``.
    hidden_size : int
        Width of ``fc1``, ``fc2`` and the GLU input.
    output_size : int
        Size of the last axis of the output.
    context_size : int or None, default None
        Size of the context vector; None for a GRN without context.
    fold_fc2 : bool, default True
        Multiply ``fc2`` into the GLU's projection (see Notes); False always runs both.

    Notes
    -----
    ``a`` is (B, in) or (B, L, in); the context ``c`` is always (B, context_size) and is
    broadcast over the L time steps, so its gradient is summed over time in backward.

    Folded ``fc2``: nothing lies between ``fc2`` and the GLU's Linear ``fc``, so the GLU's
    projection is ``eta2 (W_g W_2)^T + (W_g b_2 + b_g)``, one (N, h) x (h, 2C) product instead
    of two, and backward needs ``P = dz^T eta2`` and ``dz (W_g W_2)`` only: ``dW_g = P W_2^T +
    (dz^T 1) b_2^T``, ``dW_2 = W_g^T P``, ``db_2 = W_g^T dz^T 1`` (float rounding in another
    order, same function). Forward and backward together then take ``6 C h`` multiply-adds per
    row instead of ``3 h^2 + 6 C h``, plus ``6 C h^2`` per call for the three (2C, h) x (h, h)
    products, so the fold pays from ``N = 2C`` rows on; it is used from
    ``FOLD_MIN_ROWS_PER_OUTPUT * C`` rows (a margin for BLAS's poorer efficiency on small
    products). It applies only when neither Linear has a quantization hook or a replaced
    forward (:meth:`Linear.is_plain`): QAT and the int8 model run both Linears. The fold runs
    :meth:`GatedLinearUnit.forward_projected`, not ``gate.glu.forward``: a replaced ``forward``
    of the GLU itself needs ``fold_fc2=False``.
    """

    FOLDS = ("fold_fc2",)

    def __init__(
        self,
        input_size: int,
        hidden_size: int,
        output_size: int,
        context_size: int | None = None,
        fold_fc2: bool = True,
    ) -> None:
        super().__init__()
        grn = "GatedResidualNetwork"
        self.input_size = layer_size(grn, "input_size", input_size)
        self.hidden_size = layer_size(grn, "hidden_size", hidden_size)
        self.output_size = layer_size(grn, "output_size", output_size)
        self.context_size = (
            None if context_size is None else layer_size(grn, "context_size", context_size)
        )
        self.fold_fc2 = bool(fold_fc2)
        self.fc1 = Linear(self.input_size, self.hidden_size)
        if self.context_size is not None:
            self.context = Linear(self.context_size, self.hidden_size, bias=False)
        self.elu = ELU()
        self.fc2 = Linear(self.hidden_size, self.hidden_size)
        self.gate = GateAddNorm(self.hidden_size, self.output_size)
        if self.input_size != self.output_size:
            self.skip = Linear(self.input_size, self.output_size)

    def forward(
        self, a: np.ndarray, c: np.ndarray | None = None, out: np.ndarray | None = None
    ) -> np.ndarray:
        """``GRN(a, c) = LayerNorm(skip(a) + GLU(fc2(ELU(fc1(a) + context(c)))))``.

        Parameters
        ----------
        a : ndarray (B, input_size) or (B, L, input_size) float32 or float64
            The primary input; in the dtype of the parameters.
        c : ndarray (B, context_size), optional
            The static context, broadcast over the L time steps of a 3-D ``a``. Required
            exactly when the GRN was built with ``context_size``.
        out : ndarray (..., output_size), optional
            A C-contiguous array to write the result into (a new array when None); checked
            before anything runs (TypeError / ValueError naming it).

        Returns
        -------
        ndarray (B, output_size) or (B, L, output_size)
            ``out`` when given.

        Raises
        ------
        ValueError
            When ``c`` is given without ``context_size`` (or missing with it), ``c`` does not
            have shape ``(B, context_size)``, or ``c`` is given with an ``a`` neither 2-D nor
            3-D (its backward, which sums the context's gradient over time, failed).
        TypeError
            When ``a`` or ``c`` is not floating point (integer or bool), before anything is
            cached (an integer ``c`` was refused by ``context`` after ``fc1`` had cached ``a``).
        """
        a = V.check_float_array(a, "a")
        self.check_context(a, c)
        _check_out_first(out, a, self.output_size, self.fc1)
        z = self.fc1.forward(a, add_bias=False)  # (..., h); the bias goes in with the ELU
        skip = self.skip.forward(a) if self.input_size != self.output_size else a
        return self._body(z, skip, c, out, self.fc1.bias, projected=False)

    def check_context(self, a: np.ndarray, c: np.ndarray | None) -> None:
        """Refuse a context ``c`` that :meth:`forward` would refuse for the input ``a``, before
        anything runs (a layer that feeds this GRN checks first, so that no sub-layer caches
        its input for a forward that then fails).

        Parameters
        ----------
        a : ndarray (B, in) or (B, L, in)
            The GRN's input (its shape only).
        c : ndarray (B, context_size) or None

        Raises
        ------
        ValueError, TypeError
            As :meth:`forward` for the context.
        """
        if (c is None) != (self.context_size is None):
            raise ValueError(
                "context c must be given exactly when the GRN was built with context_size"
            )
        if c is not None:
            V.check_float_array(c, "c")
        if c is not None and a.ndim not in (2, 3):  # backward sums the context over axis 1
            raise ValueError(
                f"with a context, the GRN input must be (B, in) or (B, L, in), got {a.shape}"
            )
        if c is not None and (c.ndim != 2 or c.shape != (a.shape[0], self.context_size)):
            raise ValueError(
                f"context must have shape ({a.shape[0]}, {self.context_size}), got {c.shape}"
            )

    def forward_projected(
        self,
        z: np.ndarray,
        skip: np.ndarray,
        c: np.ndarray | None = None,
        out: np.ndarray | None = None,
        bias: np.ndarray | None = None,
    ) -> np.ndarray:
        """The GRN after its input projections: ``LayerNorm(skip + GLU(fc2(ELU(z + bias +
        context(c)))))``.

        For a caller that computes ``z = fc1(a)`` (without the bias) and ``skip(a)`` itself, in
        a cheaper way than the two Linear layers: :class:`VariableSelectionNetwork` folds its
        input embedding into them. Pair it with :meth:`backward_projected`.

        Parameters
        ----------
        z : ndarray (B, hidden_size) or (B, L, hidden_size), C-contiguous
            ``a @ fc1.weight.T``; OVERWRITTEN with the ELU's pre-activation.
        skip : ndarray (..., output_size)
            The residual, ``skip(a)`` (or ``a`` itself when input_size == output_size).
        c : ndarray (B, context_size), optional
            The static context, as in :meth:`forward`.
        out : ndarray (..., output_size), optional
            A C-contiguous array to write the result into (a new array when None); checked
            before anything runs (TypeError / ValueError naming it).
        bias : ndarray (hidden_size,), optional
            The bias added to ``z`` before the ELU; ``fc1.bias`` when None.

        Returns
        -------
        ndarray (..., output_size)
            ``out`` when given.

        Raises
        ------
        ValueError
            As :meth:`forward` for the context; when ``skip`` does not have the output's shape.
        """
        self.check_context(z, c)
        _check_out_first(out, z, self.output_size, self.fc2)
        return self._body(z, skip, c, out, self.fc1.bias if bias is None else bias, True)

    def _body(
        self,
        z: np.ndarray,
        skip: np.ndarray,
        c: np.ndarray | None,
        out: np.ndarray | None,
        bias: np.ndarray,
        projected: bool,
    ) -> np.ndarray:
        cp = None if c is None else self.context.forward(c)  # (B, h), broadcast over time
        # one compiled pass: z += bias (+ context), eta2 = ELU(z)
        eta2 = self.elu.forward(z, bias=bias, context=cp)
        glu_fc = self.gate.glu.fc
        fold = None
        rows = eta2.size // max(self.hidden_size, 1)
        if (
            self.fold_fc2
            and rows >= FOLD_MIN_ROWS_PER_OUTPUT * self.output_size
            and self.fc2.is_plain()
            and glu_fc.is_plain()
            and not self.gate.glu.dropout_active()  # the mask sits between fc2 and the GLU
        ):
            wf = glu_fc.weight @ self.fc2.weight  # (2C, h): fc2 folded into the GLU (Notes)
            bf = glu_fc.weight @ self.fc2.bias + glu_fc.bias  # (2C,)
            e2 = eta2.reshape(-1, self.hidden_size)  # (N, h)
            zg = (e2 @ wf.T).reshape(eta2.shape[:-1] + (wf.shape[0],))
            y = self.gate.forward_projected(zg, skip, bf, out=out)
            fold = (e2, wf)
        else:
            y = self.gate.forward(self.fc2.forward(eta2), skip, out=out)
        self._cache = (z.ndim, c is not None, projected, fold)
        return y

    def backward(self, dy: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
        """Accumulate every sub-layer's gradients; return the input gradients.

        Parameters
        ----------
        dy : ndarray (..., output_size)
            Gradient w.r.t. ``GRN(a, c)``, the output of the last :meth:`forward`.

        Returns
        -------
        da : ndarray
            Gradient w.r.t. ``a``, its shape.
        dc : ndarray (B, context_size) or None
            Gradient w.r.t. the context (summed over time for a 3-D ``a``); None without
            context.

        Raises
        ------
        RuntimeError
            When called before :meth:`forward`, or when the last forward was
            :meth:`forward_projected` (its pair is :meth:`backward_projected`).
        """
        if self._require_forward()[2]:  # (ndim, has_ctx, projected, fold)
            raise RuntimeError("the last forward was forward_projected: use backward_projected")
        dz, dskip, dc = self.backward_projected(dy)
        da = self.fc1.backward(dz)
        if self.input_size != self.output_size:
            da += self.skip.backward(dskip)
        else:
            da += dskip
        return da, dc

    def backward_projected(
        self, dy: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
        """Backward of :meth:`forward_projected`: accumulates the gradients of ``context``,
        ``fc2`` and the gate, NOT those of ``fc1`` and ``skip`` (the caller's projections).

        Parameters
        ----------
        dy : ndarray (..., output_size)
            Gradient w.r.t. the GRN's output of the last :meth:`forward_projected`.

        Returns
        -------
        dz : ndarray (..., hidden_size)
            Gradient w.r.t. ``z`` (and w.r.t. the bias added to it, summed over rows).
        dskip : ndarray (..., output_size)
            Gradient w.r.t. ``skip``.
        dc : ndarray (B, context_size) or None
            Gradient w.r.t. the context (summed over time for a 3-D ``z``).

        Raises
        ------
        RuntimeError
            When called before a forward.
        """
        ndim, has_ctx, _, fold = self._require_forward()
        if fold is None:
            deta1, dskip = self.gate.backward(dy)
            deta2 = self.fc2.backward(deta1)
        else:
            e2, wf = fold
            dzg, dskip = self.gate.backward_projected(dy)  # (..., 2C)
            dz2 = dzg.reshape(-1, wf.shape[0])  # (N, 2C)
            p = dz2.T @ e2  # (2C, h)
            sg = _ones(dz2.shape[0], dz2.dtype) @ dz2  # (2C,)
            glu_fc, fc2 = self.gate.glu.fc, self.fc2
            np.add(
                glu_fc.weight_grad,
                p @ fc2.weight.T + np.outer(sg, fc2.bias),
                out=glu_fc.weight_grad,
            )
            np.add(glu_fc.bias_grad, sg, out=glu_fc.bias_grad)
            np.add(fc2.weight_grad, glu_fc.weight.T @ p, out=fc2.weight_grad)
            np.add(fc2.bias_grad, glu_fc.weight.T @ sg, out=fc2.bias_grad)
            deta2 = (dz2 @ wf).reshape(dzg.shape[:-1] + (self.hidden_size,))
        dz = self.elu.backward(deta2)
        dc = None
        if has_ctx:
            dcp = dz.sum(axis=1) if ndim == 3 else dz  # (B, h): sum over broadcast time
            dc = self.context.backward(dcp)
        return dz, dskip, dc
