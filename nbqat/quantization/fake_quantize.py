"""FakeQuantize modules: an observer plus fake quantization, with PyTorch's QAT phases.

:class:`FakeQuantize` matches ``torch.ao.quantization.FakeQuantize``: ``forward(x)`` observes
``x`` and recomputes ``scale``/``zero_point`` when the observer is enabled, then fake-quantizes
when fake quantization is enabled (section 6 of the semantics reference)::

    calibration: enable_observer(), disable_fake_quant()   -> statistics only, y = x
    QAT:         enable_observer(), enable_fake_quant()    -> both
    frozen:      disable_observer(), enable_fake_quant()   -> fixed qparams

Backward is hand-written: ``forward`` leaves in ``ctx`` what ``backward`` needs (the STE mask,
or None when fake quantization was off), and ``backward(grad_y, ctx)`` takes that ctx, so one
module can serve many calls (every LSTM time step keeps its own ctx).

:class:`LearnableFakeQuantize` (:mod:`nbqat.quantization.learnable_fake_quantize`, re-exported here)
is
torch's ``_LearnableFakeQuantize`` (LSQ): trainable scale and zero point whose gradients
``backward`` accumulates into ``grad_scale`` / ``grad_zero_point``.

The arithmetic is :mod:`nbqat.quantization.fake_quant` (bit-exact with torch on float32).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from nbqat.quantization import _fake_quantize_fused as _fused
from nbqat.quantization import _validate_state as VS
from nbqat.quantization import fake_quant as _fq
from nbqat.quantization._quantizer_base import _CACHED, _axis, _numel, _QuantizerPhases
from nbqat.quantization.learnable_fake_quantize import LearnableFakeQuantize
from nbqat.quantization.observers import MovingAverageMinMaxObserver

__all__ = ["FakeQuantize", "LearnableFakeQuantize"]

_F32 = np.float32


class FakeQuantize(_QuantizerPhases):
    """Observer + fake quantization with torch's phases (``torch.ao.quantization.FakeQuantize``).

    Parameters
    ----------
    observer : observer class or factory, default MovingAverageMinMaxObserver
        Called as ``observer(**observer_kwargs)`` to build :attr:`activation_post_process`
        (``MinMaxObserver.with_args(...)`` factories work).
    quant_min, quant_max : int, optional
        A custom range, passed on to the observer (both or neither).
    **observer_kwargs
        Further observer arguments (dtype, qscheme, ch_axis, averaging_constant, ...).

    Attributes
    ----------
    activation_post_process : observer
    scale : float32 ndarray (1,) or (C,)
        Current scale (``[1.0]`` until the observer has run).
    zero_point : int32 ndarray (1,) or (C,)
    quant_min, quant_max : int
    ch_axis : int or None
        The observer's channel axis (per channel) or None (per tensor).
    is_per_channel : bool
    observer_enabled, fake_quant_enabled : bool
    ctx : bool ndarray or None
        What the last :meth:`forward` left for :meth:`backward` (the STE mask; None when fake
        quantization was disabled).

    References
    ----------
    ``torch/ao/quantization/fake_quantize.py`` (torch 2.13).
    """

    #: The quantizer protocol's flag: FakeQuantize follows its observer, learns nothing.
    learnable = False

    def __init__(
        self,
        observer: Any = MovingAverageMinMaxObserver,
        quant_min: int | None = None,
        quant_max: int | None = None,
        **observer_kwargs: Any,
    ) -> None:
        VS.check_module_range(quant_min, quant_max, type(self).__name__, strict=False)
        if quant_min is not None:
            observer_kwargs.update(quant_min=quant_min, quant_max=quant_max)
        self._bind_observer(observer, observer_kwargs)
        self.scale = np.array([1.0], _F32)
        self.zero_point = np.array([0], np.int32)

    def calculate_qparams(self) -> tuple[np.ndarray, np.ndarray]:
        """The observer's current ``(scale float32, zero_point int32)`` (shape (1,) or (C,))."""
        return self.activation_post_process.calculate_qparams()

    # -- forward / backward ------------------------------------------------------------------
    def forward(self, x: Any) -> Any:
        """Observe (if enabled), then fake-quantize (if enabled).

        Parameters
        ----------
        x : float16/float32/float64 ndarray or CUDA device array

        Returns
        -------
        y : array like ``x``
            ``fake_quantize_per_{tensor,channel}_affine(x, scale, zero_point, ...)``, or ``x``
            itself when fake quantization is disabled. Afterwards :attr:`ctx` holds the bool mask
            (or None). An empty ``x`` (shape (0, C), (C, 0), ...) gives an empty result and
            changes neither the observer nor the qparams, per tensor and per channel.

        Raises
        ------
        TypeError, ValueError
            Bad input (from the observer or the fake-quantize function); the observer state is
            unchanged when the observer rejects the batch.
        """
        if self._forward_pre_hooks:  # register_forward_pre_hook (e.g. the quantizer report)
            x = self._run_forward_pre_hooks(x)
        if _numel(x) == 0:
            return self._forward_empty(x)
        observe = self.observer_enabled
        if observe and getattr(self.activation_post_process, "process_group", None) is not None:
            # a data-parallel run: the observer combines every rank's statistics (a collective),
            # then the fused kernel fake-quantizes with the qparams (same bits either way)
            self._observe(x)
            observe = False
        if _fused.eligible(x):  # the QAT hot path: one compiled call
            done, y = self._forward_fused(x, observe)
            if done:
                return y
        if observe:
            self._observe(x)
        if not self.fake_quant_enabled:
            self.ctx = None
            self._ran = True
            return x
        if self.is_per_channel:
            y, mask = _fq.fake_quantize_per_channel_affine_cachemask(
                x, self.scale, self.zero_point, _axis(self.ch_axis), self.quant_min, self.quant_max
            )
        else:
            y, mask = _fq.fake_quantize_per_tensor_affine_cachemask(
                x, self.scale, self.zero_point, self.quant_min, self.quant_max
            )
        self.ctx = mask
        self._ran = True
        return y

    def _observe(self, x: Any) -> None:
        """The public path's observer step: observe ``x``, then take the observer's qparams."""
        self.activation_post_process(x)
        self._take_observer_qparams()

    def _take_observer_qparams(self) -> None:
        s, z = self.activation_post_process.calculate_qparams()
        self.scale = s.astype(_F32)
        self.zero_point = z.astype(np.int32)

    def _forward_fused(self, x: np.ndarray, observe: bool) -> tuple[bool, Any]:
        """The fast path of :meth:`forward` (:mod:`nbqat.quantization._fake_quantize_fused`: one
        compiled
        call, the public path's bits): ``(True, y)`` with the new state applied here, or
        ``(False, None)`` with nothing changed when the public path must run."""
        fast = _fused.forward_channel if self.is_per_channel else _fused.forward_tensor
        res = fast(self, x, observe)
        if res is None:
            return False, None
        y, mask, new = res
        if new is not None:
            mn, mx, self.scale, self.zero_point = new
            self.activation_post_process.set_min_max(mn, mx)  # the observer's public setter
        self.ctx = mask
        self._ran = True
        return True, y

    def _forward_empty(self, x: Any) -> Any:
        """:meth:`forward` of a batch without elements: qparams unchanged (unless a
        data-parallel observer took other ranks' data), an empty result and mask."""
        if self._observe_empty(x):
            self._take_observer_qparams()
        self._ran = True
        if not self.fake_quant_enabled:
            self.ctx = None
            return x
        y, self.ctx = self._empty_result(x)
        return y

    def backward(self, grad_y: Any, ctx: Any = _CACHED, *, out: Any = None) -> Any:
        """Straight-through estimator: ``grad_x = grad_y * mask``.

        Parameters
        ----------
        grad_y : float array of the forward input's shape
        ctx : bool ndarray or None, optional
            A ctx saved from :attr:`ctx` after a forward; default: the last forward's. None
            (fake quantization was off) returns a copy of ``grad_y``.
        out : array, optional
            Preallocated result of ``grad_y``'s shape and dtype; ``out=grad_y`` works in place
            (saves an allocation and a pass over fresh memory when the caller owns ``grad_y``).

        Returns
        -------
        grad_x : array like ``grad_y`` (``out`` when given)

        Raises
        ------
        RuntimeError
            No ctx given and forward has never run.
        TypeError, ValueError
            Bad ``grad_y``, ``ctx`` or ``out``
            (:func:`nbqat.quantization.fake_quant.fake_quantize_backward`).
        """
        ctx = self._saved_ctx(ctx)
        g = _fused.ste_backward(grad_y, ctx, out)  # our own forward's mask: not re-validated
        if g is not None:
            return g
        return _fq.fake_quantize_backward(grad_y, ctx, out=out)

    # -- state -------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, np.ndarray]:
        """torch's keys: flags, ``scale``, ``zero_point`` and ``activation_post_process.*``."""
        return self._with_observer_state(
            {
                "fake_quant_enabled": np.array([int(self.fake_quant_enabled)], np.uint8),
                "observer_enabled": np.array([int(self.observer_enabled)], np.uint8),
                "scale": self.scale.copy(),
                "zero_point": self.zero_point.copy(),
            }
        )

    _FLAG_KEYS = {k: k for k in ("fake_quant_enabled", "observer_enabled")}

    def _check_qparams_state(self, state: dict[str, Any]) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`load_state_dict`'s float32 scale and int32 zero point."""
        qrange = (self.quant_min, self.quant_max)
        per_tensor = not self.is_per_channel
        return VS.check_state_qparams(
            state["scale"], state["zero_point"], qrange=qrange, per_tensor=per_tensor
        )

    def _set_qparams_state(self, scale: np.ndarray, zero_point: np.ndarray) -> None:
        self.scale, self.zero_point = scale, zero_point

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(fake_quant_enabled={self.fake_quant_enabled}, "
            f"observer_enabled={self.observer_enabled}, quant_min={self.quant_min}, "
            f"quant_max={self.quant_max}, dtype={self.dtype}, qscheme={self.qscheme}, "
            f"ch_axis={self.ch_axis}, scale={self.scale}, zero_point={self.zero_point}, "
            f"activation_post_process={self.activation_post_process!r})"
        )
