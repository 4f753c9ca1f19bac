"""The gated linear unit of the TFT (GLU, Lim et al. eq. 5) and the sigmoid it gates with."""

from __future__ import annotations

import numpy as np

from nbqat import _validate as V
from nbqat._docs import LAYER_BACKWARD_RAISES, fill_doc
from nbqat.kernels import nn_cpu
from nbqat.nn.layers.dropout import Dropout
from nbqat.nn.layers.linear import Linear
from nbqat.nn.params import Module, layer_size

__all__ = ["GatedLinearUnit", "sigmoid"]


def sigmoid(x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """``1 / (1 + exp(-x))`` with NumPy's SIMD ufuncs (three passes, no temporaries beyond
    ``out``).

    Parameters
    ----------
    x : ndarray float32 or float64
        Any shape.
    out : ndarray, optional
        Array of ``x``'s shape and dtype to write into (may be ``x`` itself); a new array
        when None.

    Returns
    -------
    ndarray
        ``sigmoid(x)``, shape and dtype of ``x`` (``out`` when given).
    """
    out = np.negative(x, out=out)
    np.exp(out, out=out)
    out += x.dtype.type(1)
    return np.reciprocal(out, out=out)


class GatedLinearUnit(Module):
    """``GLU(a) = (W_v a + b_v) * sigmoid(W_g a + b_g)`` (Lim et al. eq. 5).

    Both projections are ONE :class:`Linear` ``fc`` (input_size -> 2 * output_size), value rows
    first and gate rows second (the layout of ``torch.nn.functional.glu`` and of
    pytorch-forecasting's GatedLinearUnit), so a QAT pass sees it as a single Linear.
    ``forward(x, residual)`` adds ``residual`` inside the same compiled pass.

    Parameters
    ----------
    input_size : int
        Size of the last axis of the input.
    output_size : int
        C, size of the last axis of the output; ``fc`` maps input_size -> 2 * C.

    Attributes
    ----------
    dropout : Dropout or None
        Applied to the GLU's input, as in the TFT paper ("dropout before the gating layer")
        and pytorch-forecasting's GatedLinearUnit; None (the default) or in evaluation mode it
        is the identity. :class:`~nbqat.nn.TemporalFusionTransformer` attaches one per GLU when
        ``TFTConfig.dropout > 0``.
    """

    def __init__(self, input_size: int, output_size: int) -> None:
        super().__init__()
        self.input_size = layer_size("GatedLinearUnit", "input_size", input_size)
        self.output_size = layer_size("GatedLinearUnit", "output_size", output_size)
        self.fc = Linear(self.input_size, 2 * self.output_size)
        self.dropout: Dropout | None = None

    def dropout_active(self) -> bool:
        """True when the next forward applies a dropout mask to the input."""
        return self.dropout is not None and self.dropout.active()

    def forward(self, x: np.ndarray, residual: np.ndarray | None = None) -> np.ndarray:
        """``GLU(x)`` [+ ``residual``]; the projection and the sigmoid gate are cached.

        Parameters
        ----------
        x : ndarray (..., input_size)
            The GLU's input (any leading shape), in the parameters' float dtype.
        residual : ndarray (..., output_size), optional
            Added to the gated output in the same pass (cast to the output's dtype).

        Returns
        -------
        ndarray (..., output_size)
            ``value * sigmoid(gate)`` [+ ``residual``], a new array.

        Raises
        ------
        ValueError
            When ``residual`` does not have the output's shape (checked before ``fc`` runs:
            refused after it, ``fc`` kept the new input for the next backward while the GLU
            kept the old forward).
        TypeError
            When ``x`` is not floating point (integer or bool; before the dropout runs).
        """
        x = V.check_float_array(x, "x")
        shape = (*np.shape(x)[:-1], self.output_size)
        if residual is not None and np.shape(residual) != shape:
            raise ValueError(f"residual must have shape {shape}, got {np.shape(residual)}")
        if self.dropout is not None:
            x = self.dropout.forward(x)
        z = self.fc.forward(x, add_bias=False)  # (..., 2C); the kernel adds the bias
        return self.forward_projected(z, residual, self.fc.bias)

    def forward_projected(
        self, z: np.ndarray, residual: np.ndarray | None, bias: np.ndarray
    ) -> np.ndarray:
        """The GLU after its projection: ``value * sigmoid(gate)`` [+ ``residual``] of
        ``z + bias`` (value columns first).

        Parameters
        ----------
        z : ndarray (..., 2 * output_size), C-contiguous
            ``x @ fc.weight.T`` or an equivalent product; OVERWRITTEN with ``z + bias`` (kept
            for backward).
        residual : ndarray (..., output_size) or None
            As in :meth:`forward`.
        bias : ndarray (2 * output_size,)
            The bias of the projection (``fc.bias`` for :meth:`forward`); cast to ``z``'s
            dtype.

        Returns
        -------
        ndarray (..., output_size)
            A new array. Pair with :meth:`backward_projected`.

        Raises
        ------
        ValueError
            When ``z`` is not a C-contiguous float array with last dimension 2 * output_size,
            ``bias`` is not (2 * output_size,), or ``residual`` does not have the output's
            shape.
        """
        c = self.output_size
        if (
            not isinstance(z, np.ndarray)
            or z.ndim < 1
            or z.shape[-1] != 2 * c
            or not z.flags.c_contiguous
            or z.dtype.kind != "f"
        ):
            raise ValueError(
                f"z must be a C-contiguous float array (..., {2 * c}), got "
                f"{getattr(z, 'shape', type(z))}"
            )
        if np.shape(bias) != (2 * c,):
            raise ValueError(f"bias must have shape ({2 * c},), got {np.shape(bias)}")
        bias = np.asarray(bias, dtype=z.dtype)
        z2 = z.reshape(-1, 2 * c)  # (N, 2C)
        out = np.empty(z.shape[:-1] + (c,), dtype=z.dtype)
        if residual is None:
            skip = out.reshape(-1, c)  # unread when has_skip is False
            has_skip = False
        else:
            if residual.shape != out.shape:
                raise ValueError(f"residual must have shape {out.shape}, got {residual.shape}")
            skip = np.ascontiguousarray(residual, dtype=z.dtype).reshape(-1, c)
            has_skip = True
        sig = np.empty((z2.shape[0], c), dtype=z.dtype)  # sigmoid(gate), kept for backward
        nn_cpu.glu_forward(z2, bias, skip, has_skip, out.reshape(-1, c), sig)
        self._cache = (z2, sig)
        return out

    @fill_doc(layer_backward_raises=LAYER_BACKWARD_RAISES)
    def backward(self, dy: np.ndarray) -> np.ndarray:
        """Accumulate the gradients of ``fc`` and return the gradient w.r.t. ``x``.

        The residual's gradient is ``dy`` itself (the caller's to use).

        Parameters
        ----------
        dy : ndarray (..., output_size)
            Gradient w.r.t. ``GLU(x)`` [+ ``residual``], the last :meth:`forward`'s output.

        Returns
        -------
        ndarray (..., input_size)
            ``dx``.

        {layer_backward_raises}
        """
        dx = self.fc.backward(self.backward_projected(dy))
        return dx if self.dropout is None else self.dropout.backward(dx)

    def backward_projected(self, dy: np.ndarray) -> np.ndarray:
        """Gradient w.r.t. the projection ``z`` (and its bias, summed over rows); ``fc``'s
        gradients are NOT accumulated.

        Parameters
        ----------
        dy : ndarray (..., output_size)
            Gradient w.r.t. the gated output of the last forward (either kind).

        Returns
        -------
        ndarray (..., 2 * output_size)
            ``dz``.

        Raises
        ------
        RuntimeError
            When called before a forward.
        ValueError
            When ``dy`` does not have the last output's shape.
        """
        z2, sig = self._require_forward()
        c = self.output_size
        if np.shape(dy)[-1:] != (c,) or np.size(dy) != sig.size:
            raise ValueError(
                f"dy must have the last output's shape (..., {c}) with {sig.shape[0]} rows, got "
                f"{np.shape(dy)}"
            )
        dy2 = np.ascontiguousarray(dy, dtype=z2.dtype).reshape(-1, c)
        dz = np.empty_like(z2)
        nn_cpu.glu_backward(dy2, z2, sig, dz)
        return dz.reshape(dy.shape[:-1] + (2 * c,))
