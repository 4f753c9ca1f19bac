"""Time-distributed linear layer with weight / input fake-quantization hooks."""

from __future__ import annotations

import functools
import math
from typing import Any

import numpy as np

from nbqat import _validate as V
from nbqat.kernels import nn_cpu
from nbqat.nn.init import uniform_init
from nbqat.nn.params import Module, layer_size
from nbqat.quantization.fake_quantize import FakeQuantize


@functools.lru_cache(maxsize=32)
def _ones(n: int, dtype: np.dtype) -> np.ndarray:
    """A read-only (n,) vector of ones (the bias gradient's column sum as a BLAS gemv)."""
    v = np.ones(n, dtype=dtype)
    v.flags.writeable = False
    return v


def hook_backward(hook: Any, grad: np.ndarray, ctx: Any) -> np.ndarray:
    """``hook.backward(grad, ctx)``, written into ``grad`` itself when the hook is nbqat's
    :class:`~nbqat.FakeQuantize` (``out=``: no allocation, no pass over fresh memory). ``grad``
    must be a temporary the caller owns; any other hook gets the plain call."""
    if type(hook) is FakeQuantize:
        return hook.backward(grad, ctx, out=grad)
    return hook.backward(grad, ctx)


def _as_rows(x: np.ndarray, n_last: int, name: str) -> np.ndarray:
    if x.ndim < 1 or x.shape[-1] != n_last:
        raise ValueError(f"{name} must have last dimension {n_last}, got shape {x.shape}")
    return np.ascontiguousarray(x).reshape(-1, n_last)


class Linear(Module):
    """``y = x @ W.T + b`` over the last axis of ``x`` (any leading shape: time-distributed).

    Parameters
    ----------
    in_features : int
        Size of the last axis of the input.
    out_features : int
        Size of the last axis of the output.
    bias : bool, default True
        Whether to add the learned ``bias`` (out_features,); without it there is no ``bias``
        parameter at all.

    Attributes
    ----------
    weight : ndarray (out_features, in_features)
        PyTorch's layout; ``bias`` (out_features,). ``weight_grad`` / ``bias_grad`` are the
        matching views of the flat gradient buffer.
    weight_fake_quant, input_fake_quant : hook or None
        Quantization hooks (see Notes); None (the default) is the float path.

    Notes
    -----
    A hook has ``forward(x) -> y``, then ``hook.ctx``, and ``backward(grad, ctx) -> grad``.
    forward: ``xq = input_fake_quant(x)``, ``Wq = weight_fake_quant(W)``, ``y = xq @ Wq.T + b``;
    backward: ``dW += weight_fake_quant.backward(dy^T xq, ctx_w)``, ``db += sum dy``,
    ``dx = input_fake_quant.backward(dy @ Wq, ctx_x)``. Initialisation is torch's:
    ``U(-1/sqrt(in), 1/sqrt(in))`` for weight and bias.
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = True) -> None:
        super().__init__()
        self.in_features = layer_size("Linear", "in_features", in_features)
        self.out_features = layer_size("Linear", "out_features", out_features)
        self.has_bias = bool(bias)
        bound = 1.0 / math.sqrt(self.in_features)
        self.declare("weight", (self.out_features, self.in_features), uniform_init(bound))
        if self.has_bias:
            self.declare("bias", (self.out_features,), uniform_init(bound))
        self.weight_fake_quant: Any = None
        self.input_fake_quant: Any = None

    def is_plain(self) -> bool:
        """True when this layer computes exactly ``x @ W.T + b``: no quantization hook. Only
        then may a caller fold it algebraically into a neighbouring affine map. (The int8
        model's integer matmul is another module type, :class:`~nbqat.nn.QuantizedLinear`,
        whose ``is_plain`` is False.)"""
        return self.input_fake_quant is None and self.weight_fake_quant is None

    def forward(self, x: np.ndarray, add_bias: bool = True) -> np.ndarray:
        """``y = input_fake_quant(x) @ weight_fake_quant(W).T + b`` over the last axis.

        Parameters
        ----------
        x : ndarray (..., in_features) float32 or float64
            Any leading shape (time-distributed); normally in the dtype of ``weight``. Kept by
            reference for :meth:`backward`'s weight gradient (edit it in place before then and
            that gradient changes).
        add_bias : bool, default True
            False leaves the bias out of ``y`` for a caller that adds it inside its own compiled
            pass (:class:`GatedResidualNetwork` into its ELU). :meth:`backward` is the same
            either way (the bias gradient is the column sum of ``dy``).

        Returns
        -------
        ndarray (..., out_features)
            In the dtype of ``weight`` (for an input of that dtype). The (fake-quantized) input
            and weight are cached for :meth:`backward`.

        Raises
        ------
        ValueError
            When the last dimension of ``x`` is not ``in_features``.
        TypeError
            When ``x`` is not floating point (an integer or bool ``x`` gave a float64 ``y``
            from a float32 layer).
        """
        x = V.check_float_array(x, "x")
        lead = x.shape[:-1]
        x2 = _as_rows(x, self.in_features, "Linear input")  # (N, in)
        ctx_x = ctx_w = None
        if self.input_fake_quant is not None:
            xq = self.input_fake_quant.forward(x2)  # (N, in)
            ctx_x = self.input_fake_quant.ctx
        else:
            xq = x2
        if self.weight_fake_quant is not None:
            wq = self.weight_fake_quant.forward(self.weight)  # (out, in)
            ctx_w = self.weight_fake_quant.ctx
        else:
            wq = self.weight
        y = xq @ wq.T  # (N, out)
        if self.has_bias and add_bias:
            nn_cpu.bias_add(y, self.bias)
        self._cache = (xq, wq, ctx_x, ctx_w, lead)
        return y.reshape(*lead, self.out_features)

    def backward(self, dy: np.ndarray) -> np.ndarray:
        """Accumulate ``weight_grad`` / ``bias_grad`` (``+=``) and return the input gradient.

        Parameters
        ----------
        dy : ndarray (..., out_features)
            Gradient w.r.t. the output of the last :meth:`forward` (same leading shape).

        Returns
        -------
        ndarray (..., in_features)
            ``dx``, through the input quantizer's straight-through estimator when there is one.

        Raises
        ------
        RuntimeError
            When called before :meth:`forward`.
        ValueError
            When ``dy`` is not ``(..., out_features)`` with the last forward's leading shape
            (another leading shape of as many rows would pair its rows with the wrong inputs).
        """
        xq, wq, ctx_x, ctx_w, lead = self._require_forward()
        if np.shape(dy) != (*lead, self.out_features):
            raise ValueError(
                f"Linear.backward: dy must have shape {(*lead, self.out_features)} (the last "
                f"forward's), got {np.shape(dy)}"
            )
        dy2 = _as_rows(dy, self.out_features, "Linear grad")  # (N, out)
        dwq = dy2.T @ xq  # (out, in)
        if self.weight_fake_quant is not None:
            dwq = hook_backward(self.weight_fake_quant, dwq, ctx_w)
        np.add(self.weight_grad, dwq, out=self.weight_grad)
        if self.has_bias:
            # column sum through BLAS gemv (~4x faster than ndarray.sum(axis=0) here)
            np.add(self.bias_grad, _ones(dy2.shape[0], dy2.dtype) @ dy2, out=self.bias_grad)
        dx = dy2 @ wq  # (N, in)
        if self.input_fake_quant is not None:
            dx = hook_backward(self.input_fake_quant, dx, ctx_x)
        return dx.reshape(*lead, self.in_features)
