"""Sequential: layers applied one after the other, backward in reverse (torch.nn.Sequential)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np

from nbqat.nn.params import Module

__all__ = ["Sequential"]


class Sequential(Module):
    """``y = layers[-1](...layers[1](layers[0](x)))``; backward runs the layers in reverse.

    Parameters
    ----------
    *layers : Module
        Each takes one array and returns one array (``Linear``, ``ELU``, ``LayerNorm``, a
        ``Sequential``, a user's own Module ...), registered under the names "0", "1", ...
        like torch's.

    Raises
    ------
    TypeError
        When a layer is not an nbqat Module; in forward, a layer that returns a tuple; in
        backward, one whose backward returns gradients of several inputs (a GRN without its
        context returns ``(dx, None)``, which passes).

    Examples
    --------
    >>> from nbqat.nn import ELU, Linear, ParameterBuffer, Sequential
    >>> model = Sequential(Linear(6, 16), ELU(), Linear(16, 3))
    >>> buf = ParameterBuffer(model, seed=0)
    """

    def __init__(self, *layers: Module) -> None:
        super().__init__()
        for i, layer in enumerate(layers):
            if not isinstance(layer, Module):
                raise TypeError(
                    f"Sequential: layer {i} is a {type(layer).__name__}, not an nbqat Module"
                )
            setattr(self, str(i), layer)

    def __getitem__(self, i: int) -> Any:
        return list(self._modules.values())[i]

    def __len__(self) -> int:
        return len(self._modules)

    def __iter__(self) -> Iterator[Any]:
        return iter(self._modules.values())

    def forward(self, x: np.ndarray) -> np.ndarray:
        """Apply every layer in order.

        Parameters
        ----------
        x : ndarray (..., in_features)
            The first layer's input.

        Returns
        -------
        ndarray
            The last layer's output. A forward that raises leaves no forward behind (a
            :meth:`backward` then raises RuntimeError): the layers before the failing one
            would hold this call's caches, the rest the last call's.
        """
        self._cache = None
        for i, layer in enumerate(self._modules.values()):
            x = layer.forward(x)
            if isinstance(x, tuple):  # a VariableSelectionNetwork's (output, weights)
                raise TypeError(
                    f"Sequential: layer {i} ({type(layer).__name__}) returned a tuple; "
                    "Sequential chains layers of one input and one output array"
                )
        self._cache = True
        return x

    def backward(self, dy: np.ndarray) -> np.ndarray:
        """Backpropagate through the layers in reverse; gradients accumulate (``+=``).

        Parameters
        ----------
        dy : ndarray
            Gradient w.r.t. the output of the last :meth:`forward`.

        Returns
        -------
        ndarray
            Gradient w.r.t. the input ``x``.

        Raises
        ------
        RuntimeError
            Before any forward, or after a forward that raised.
        """
        self._require_forward()
        for i, layer in reversed(list(enumerate(self._modules.values()))):
            dy = layer.backward(dy)
            if isinstance(dy, tuple):  # (dx, d_context): a GRN, its optional context unused
                if any(g is not None for g in dy[1:]):
                    raise TypeError(
                        f"Sequential: layer {i} ({type(layer).__name__}) returned gradients "
                        "for several inputs; Sequential chains one-input layers"
                    )
                dy = dy[0]
        return dy
