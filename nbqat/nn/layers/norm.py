"""Layer normalisation over the last axis."""

from __future__ import annotations

import numpy as np

from nbqat import _validate as V
from nbqat._docs import LAYER_BACKWARD_RAISES, fill_doc
from nbqat.kernels import nn_cpu
from nbqat.nn.init import constant_init
from nbqat.nn.params import Module, layer_size


class LayerNorm(Module):
    """``y = (x - mean) / sqrt(var + eps) * weight + bias`` over the last axis
    (torch.nn.LayerNorm(normalized_shape, eps=1e-5), biased variance).

    Backward (``g = dy * weight``): ``dx = rstd * (g - mean(g) - xhat * mean(g * xhat))``,
    ``dweight += sum dy * xhat``, ``dbias += sum dy``; the sums over rows are chunked by a fixed
    row count and merged in order (deterministic).

    Parameters
    ----------
    normalized_shape : int
        C, the size of the normalised last axis; ``weight`` (init 1) and ``bias`` (init 0)
        have shape (C,).
    eps : float, default 1e-5
        Added to the variance before the square root; finite and > 0 (torch takes any float,
        but a negative ``eps`` silently rescales every row and 0 or NaN gives NaN rows).

    Raises
    ------
    ValueError
        When ``normalized_shape`` is not a positive int, or ``eps`` not finite and > 0.
    TypeError
        When ``eps`` is not a real number.
    """

    def __init__(self, normalized_shape: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.normalized_shape = layer_size("LayerNorm", "normalized_shape", normalized_shape)
        self.eps = V.check_positive_finite(eps, "LayerNorm eps")
        self.declare("weight", (self.normalized_shape,), constant_init(1.0))
        self.declare("bias", (self.normalized_shape,), constant_init(0.0))

    def forward(self, x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        """Normalise ``x`` over its last axis; mean and ``1/std`` are cached for backward.

        Parameters
        ----------
        x : ndarray (..., C) float32 or float64
            Any leading shape; in the dtype of the parameters. Kept by reference for
            :meth:`backward` (edit it in place before then and the gradients change).
        out : ndarray (..., C), optional
            A C-contiguous array of ``x``'s shape and dtype to write the result into
            (a new array when None).

        Returns
        -------
        ndarray (..., C)
            The normalised, scaled and shifted ``x`` (``out`` when given).

        Raises
        ------
        ValueError
            When the last dimension of ``x`` is not ``normalized_shape``; ``out`` not of
            ``x``'s shape, read-only or not C-contiguous.
        TypeError
            When ``x`` is neither float32 nor float64; ``out`` not an array of its dtype.
        """
        c = self.normalized_shape
        if x.shape[-1] != c:
            raise ValueError(f"LayerNorm input must have last dimension {c}, got {x.shape}")
        if x.dtype not in (np.float32, np.float64):  # integers; float16: Numba's error
            raise TypeError(f"LayerNorm input must be float32 or float64, got {x.dtype}")
        if out is not None:  # the kernel writes N rows through a flat view: out of bounds
            V.check_out(out, x.shape, x.dtype, "LayerNorm out", contiguous=True)
        x2 = np.ascontiguousarray(x).reshape(-1, c)  # (N, C)
        n = x2.shape[0]
        y = np.empty(x.shape, dtype=x2.dtype) if out is None else out
        mean = np.empty(n, dtype=x2.dtype)
        rstd = np.empty(n, dtype=x2.dtype)
        nn_cpu.layernorm_forward(x2, self.weight, self.bias, self.eps, y.reshape(-1, c), mean, rstd)
        self._cache = (x2, mean, rstd, x.shape)
        return y

    @fill_doc(layer_backward_raises=LAYER_BACKWARD_RAISES)
    def backward(self, dy: np.ndarray) -> np.ndarray:
        """Accumulate ``weight_grad`` / ``bias_grad`` (``+=``) and return the input gradient.

        Parameters
        ----------
        dy : ndarray (..., C)
            Gradient w.r.t. the output of the last :meth:`forward` (cast to its dtype).

        Returns
        -------
        ndarray (..., C)
            ``dx``, the shape and dtype of the forward input.

        {layer_backward_raises}
        """
        x2, mean, rstd, shape = self._require_forward()
        c = self.normalized_shape
        dy2 = self._grad_in(dy, shape, x2.dtype).reshape(-1, c)
        n = x2.shape[0]
        nchunks = max(1, -(-n // nn_cpu.ROW_CHUNK))
        dw = np.empty((nchunks, c), dtype=x2.dtype)
        db = np.empty((nchunks, c), dtype=x2.dtype)
        dx = np.empty_like(x2)
        nn_cpu.layernorm_backward(dy2, x2, self.weight, mean, rstd, dx, dw, db)
        np.add(self.weight_grad, dw.sum(axis=0), out=self.weight_grad)
        np.add(self.bias_grad, db.sum(axis=0), out=self.bias_grad)
        return dx.reshape(shape)
