"""ELU activation (alpha = 1)."""

from __future__ import annotations

import numpy as np

from nbqat._docs import LAYER_BACKWARD_RAISES, fill_doc
from nbqat.kernels import nn_cpu
from nbqat.nn.params import Module


class ELU(Module):
    """``ELU(x) = x if x > 0 else exp(x) - 1`` (torch.nn.ELU, alpha=1), elementwise.

    Backward: ``dx = dy if x > 0 else dy * (y + 1)``.

    ELU has no parameters and no constructor arguments.
    """

    def forward(
        self,
        x: np.ndarray,
        bias: np.ndarray | None = None,
        context: np.ndarray | None = None,
    ) -> np.ndarray:
        """Apply ELU elementwise; the pre-activation and the output are cached for
        :meth:`backward`.

        Parameters
        ----------
        x : ndarray (..., C) float32 or float64
            Any leading shape (made C-contiguous; kept by reference for :meth:`backward`'s
            mask, so an in-place edit before then changes ``dx``). With ``bias`` or
            ``context`` it must be C-contiguous and is OVERWRITTEN with the pre-activation
            ``x + bias + context`` (the :class:`GatedResidualNetwork` hands over its ``fc1``
            output this way).
        bias : ndarray (C,), optional
            Added to every row before the activation, in the same compiled pass.
        context : ndarray (B, C), optional
            A static context added to every row of batch element ``b`` (``x`` is (B, L, C) or
            (B, C)), in the same pass.

        Returns
        -------
        ndarray
            ``ELU(x [+ bias] [+ context])``, same shape and dtype as ``x`` (a new array).

        Raises
        ------
        ValueError
            When ``bias`` is not (C,), ``context`` not (B, C), or ``x`` is not C-contiguous
            while one of them is given.
        TypeError
            When ``x`` is neither float32 nor float64.
        """
        if np.asarray(x).dtype not in (np.float32, np.float64):  # Numba's error otherwise
            raise TypeError(f"ELU: x must be float32 or float64, got {np.asarray(x).dtype}")
        fused = bias is not None or context is not None
        if fused and not x.flags.c_contiguous:
            raise ValueError("ELU: x must be C-contiguous when bias or context is given")
        x = np.ascontiguousarray(x)
        c = x.shape[-1] if x.ndim else 1
        x2 = x.reshape(-1, c)  # (N, C)
        steps = 1
        if bias is not None and bias.shape != (c,):
            raise ValueError(f"ELU: bias must have shape ({c},), got {bias.shape}")
        if context is not None:
            nb = x.shape[0]
            if context.shape != (nb, c):
                raise ValueError(f"ELU: context must have shape ({nb}, {c}), got {context.shape}")
            steps = x2.shape[0] // max(nb, 1)
        y = np.empty_like(x)
        if x2.size == 0:  # nothing to compute (and no row to broadcast a context over)
            self._cache = (x, y)
            return y
        nn_cpu.elu_forward(
            x2,
            x2[0] if bias is None else np.asarray(bias, dtype=x.dtype),  # unread without bias
            bias is not None,
            x2[:1] if context is None else np.ascontiguousarray(context, dtype=x.dtype),
            context is not None,
            steps,
            y.reshape(-1, c),
        )
        self._cache = (x, y)
        return y

    @fill_doc(layer_backward_raises=LAYER_BACKWARD_RAISES)
    def backward(self, dy: np.ndarray) -> np.ndarray:
        """Gradient w.r.t. the input of the last :meth:`forward`.

        Parameters
        ----------
        dy : ndarray
            Gradient w.r.t. the output, the shape of the forward input (cast to its dtype).

        Returns
        -------
        ndarray
            ``dx``, same shape and dtype as the forward input.

        {layer_backward_raises}
        """
        x, y = self._require_forward()
        dy = self._grad_in(dy, x.shape, x.dtype)
        dx = np.empty_like(x)
        nn_cpu.elu_backward(dy.reshape(-1), x.reshape(-1), y.reshape(-1), dx.reshape(-1))
        return dx
