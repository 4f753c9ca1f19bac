"""LSQ fake quantization with a trainable scale and zero point (torch's ``_LearnableFakeQuantize``).

:class:`LearnableFakeQuantize` (also importable from :mod:`nbqat.quantization.fake_quantize` and
``nbqat``):
the arithmetic is :mod:`nbqat.quantization.fake_quant`'s
``fake_quantize_learnable_per_{tensor,channel}_affine``
and their backward; the phase switches are :class:`nbqat.FakeQuantize`'s.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from nbqat import _validate as V
from nbqat.quantization import _validate_qparams as VQ
from nbqat.quantization import _validate_state as VS
from nbqat.quantization import fake_quant as _fq
from nbqat.quantization._quantizer_base import _CACHED, _axis, _numel, _QuantizerPhases
from nbqat.quantization.observers import MovingAverageMinMaxObserver

__all__ = ["LearnableFakeQuantize"]

_F32 = np.float32


class LearnableFakeQuantize(_QuantizerPhases):
    """LSQ fake quantization with a trainable scale and zero point (torch's
    ``_LearnableFakeQuantize``).

    Parameters
    ----------
    observer : observer class or factory, default MovingAverageMinMaxObserver
        Gives the static estimates of scale / zero point while the observer is enabled.
    quant_min, quant_max : int, default 0, 255
        The integer range (passed on to the observer).
    scale, zero_point : float, default 1.0, 0.0
        Initial values (float32): a scale the fake-quantize functions take, a finite zero
        point (TypeError / ValueError otherwise, naming the argument).
    channel_len : int, default -1
        -1 per tensor (shape (1,)); else the channel count of the initial per-channel arrays.
    use_grad_scaling : bool, default True
        Scale the scale / zero-point gradients by ``1 / sqrt(numel * quant_max)`` (the LSQ paper's
        choice and the reference's module default; torch's own default is False).
    **observer_kwargs
        Further observer arguments.

    Attributes
    ----------
    scale, zero_point : float32 ndarray (1,) or (C,)
    grad_scale, grad_zero_point : float32 ndarray, shape of ``scale``
        Accumulated by :meth:`backward`; cleared by :meth:`zero_grad`.
    observer_enabled, fake_quant_enabled, learning_enabled : bool
    shard_rows : (int, int) or None
        ``(local rows, global rows)`` of a data-parallel step (set on activation quantizers by
        :func:`nbqat.distributed.data_parallel_step`): the gradient factor then uses the
        global batch's element count, so the allreduced gradients equal one process's.
    ctx : tuple or None
        ``(x, scale, zero_point, grad_factor)`` of the last forward (None: fake quant off).
        ``x`` is kept by reference: do not modify it in place before backward.

    Notes
    -----
    Forward: if observing, copy the observer's qparams into scale / zero_point, else clamp the
    scale to ``>= eps``; if fake-quantizing (symmetric qschemes zero the zero point first, as
    torch), ``fake_quantize_learnable_per_{tensor,channel}_affine``.

    References
    ----------
    S. K. Esser et al., "Learned Step Size Quantization", ICLR 2020.
    ``torch/ao/quantization/_learnable_fake_quantize.py`` (torch 2.13).
    """

    #: The quantizer protocol's flag: scale and zero point are learned (LSQ).
    learnable = True

    def __init__(
        self,
        observer: Any = MovingAverageMinMaxObserver,
        quant_min: int = 0,
        quant_max: int = 255,
        scale: float = 1.0,
        zero_point: float = 0.0,
        channel_len: int = -1,
        use_grad_scaling: bool = True,
        **observer_kwargs: Any,
    ) -> None:
        who = type(self).__name__
        VS.check_module_range(quant_min, quant_max, who, strict=True)
        channel_len = VS.check_channel_len(channel_len, who)
        s = VQ.check_scale(scale)
        z = VQ.check_float_zero_point(zero_point)  # NaN / Inf failed every learning forward
        observer_kwargs.update(quant_min=quant_min, quant_max=quant_max)
        self._bind_observer(observer, observer_kwargs)
        n = 1 if channel_len == -1 else channel_len
        self.scale = np.full(n, s, _F32)
        self.zero_point = np.full(n, z, _F32)
        self.grad_scale = np.zeros(n, _F32)
        self.grad_zero_point = np.zeros(n, _F32)
        self.use_grad_scaling = bool(use_grad_scaling)
        self.eps = _F32(np.finfo(np.float32).eps)
        self.learning_enabled = False
        self.shard_rows: tuple[int, int] | None = None

    def enable_param_learning(self) -> LearnableFakeQuantize:
        """Learn scale / zero point: learning on, fake quant on, observer off. Returns self."""
        self.learning_enabled, self.fake_quant_enabled, self.observer_enabled = True, True, False
        return self

    def enable_static_estimate(self) -> LearnableFakeQuantize:
        """Observer estimates: learning off, fake quant on, observer on. Returns self."""
        self.learning_enabled, self.fake_quant_enabled, self.observer_enabled = False, True, True
        return self

    def enable_static_observation(self) -> LearnableFakeQuantize:
        """Observe only: learning off, fake quant off, observer on. Returns self."""
        self.learning_enabled, self.fake_quant_enabled, self.observer_enabled = False, False, True
        return self

    def calculate_qparams(self) -> tuple[np.ndarray, np.ndarray]:
        """Clamp the scale to ``>= eps`` (in place, as torch) and return ``(scale float32,
        clamp(rint(zero_point), quant_min, quant_max) int32)``."""
        np.maximum(self.scale, self.eps, out=self.scale)
        zp = np.clip(np.rint(self.zero_point), self.quant_min, self.quant_max)
        return self.scale.copy(), zp.astype(np.int32)

    def zero_grad(self) -> None:
        """Set ``grad_scale`` and ``grad_zero_point`` to zero."""
        self.grad_scale[...] = 0
        self.grad_zero_point[...] = 0

    def _set_shape(self, n: int) -> None:
        if self.scale.size != n:
            self.scale = np.ones(n, _F32)
            self.zero_point = np.zeros(n, _F32)
            self.grad_scale = np.zeros(n, _F32)
            self.grad_zero_point = np.zeros(n, _F32)

    def forward(self, x: Any) -> Any:
        """Observe / clamp, then LSQ fake quantization (see the class Notes).

        Parameters
        ----------
        x : float ndarray or CUDA device array

        Returns
        -------
        y : array like ``x`` (``x`` itself when fake quantization is disabled)
        """
        if self._forward_pre_hooks:  # register_forward_pre_hook (e.g. the quantizer report)
            x = self._run_forward_pre_hooks(x)
        numel = _numel(x)
        if numel == 0 and self._observe_empty(x):  # a data-parallel observer took other ranks'
            self._take_observer_qparams()
        elif numel and self.observer_enabled:
            self.activation_post_process(x)
            self._take_observer_qparams()
        elif not self.observer_enabled:
            np.maximum(self.scale, self.eps, out=self.scale)
        self._ran = True
        if not self.fake_quant_enabled:
            self.ctx = None
            return x
        if numel == 0:  # nothing to quantize, nothing to learn from; the qparams unchanged
            y, _ = self._empty_result(x)
            self.ctx = (x, self.scale.copy(), self.zero_point.copy(), 1.0)
            return y
        if self.qscheme.endswith("symmetric"):
            self.zero_point[...] = 0
        gf = self._grad_factor(numel)
        s, z = self.scale.copy(), self.zero_point.copy()
        if self.is_per_channel:
            y = _fq.fake_quantize_learnable_per_channel_affine(
                x, s, z, _axis(self.ch_axis), self.quant_min, self.quant_max, gf
            )
        else:
            y = _fq.fake_quantize_learnable_per_tensor_affine(
                x, s, z, self.quant_min, self.quant_max, gf
            )
        self.ctx = (x, s, z, gf)
        return y

    def _take_observer_qparams(self) -> None:
        s, z = self.activation_post_process.calculate_qparams()
        self._set_shape(s.size)
        self.scale[...] = s
        self.zero_point[...] = z

    def _grad_factor(self, numel: int) -> float:
        """LSQ's gradient factor ``1 / sqrt(N * quant_max)`` (1.0 without grad scaling), ``N``
        the element count of the GLOBAL batch: ``numel`` itself, or ``numel * global / local``
        under :attr:`shard_rows` (the factor of the one-process run on the whole batch)."""
        if not self.use_grad_scaling:
            return 1.0
        n = float(numel)
        if self.shard_rows is not None and self.shard_rows[0] > 0:
            local, whole = self.shard_rows
            n = n * whole / local
        return 1.0 / math.sqrt(n * self.quant_max)

    def backward(self, grad_y: Any, ctx: Any = _CACHED) -> Any:
        """LSQ backward: returns ``grad_x`` and accumulates ``grad_scale``/``grad_zero_point``.

        Parameters
        ----------
        grad_y : float array of the forward input's shape
        ctx : tuple or None, optional
            A saved :attr:`ctx` (default: the last forward's). None returns a copy of ``grad_y``.

        Returns
        -------
        grad_x : array like ``grad_y``

        Raises
        ------
        RuntimeError
            No ctx given and forward has never run.
        ValueError
            The ctx's qparams have another shape than the current scale.
        """
        ctx = self._saved_ctx(ctx)
        if ctx is None:
            return _fq.fake_quantize_backward(grad_y, None)
        x, s, z, gf = ctx
        if _numel(x) == 0:  # an empty batch (x may be any host array-like, a float too)
            V.check_same_shape(x, grad_y, "the ctx's x", "grad_y")
            return _fq.fake_quantize_backward(grad_y, None)  # an empty copy (CPU or CUDA)
        V.check_same_shape(self.grad_scale, s, "grad_scale", "the ctx's scale")
        if self.is_per_channel:
            gx, gs, gz = _fq.fake_quantize_learnable_per_channel_affine_backward(
                grad_y, x, s, z, _axis(self.ch_axis), self.quant_min, self.quant_max, gf
            )
        else:
            gx, gs, gz = _fq.fake_quantize_learnable_per_tensor_affine_backward(
                grad_y, x, s, z, self.quant_min, self.quant_max, gf
            )
        self.grad_scale += np.asarray(gs, _F32).reshape(self.grad_scale.shape)
        self.grad_zero_point += np.asarray(gz, _F32).reshape(self.grad_zero_point.shape)
        return gx

    def state_dict(self) -> dict[str, np.ndarray]:
        """Flags, ``scale``, ``zero_point`` (float32), ``eps`` and ``activation_post_process.*``."""
        return self._with_observer_state(
            {
                "fake_quant_enabled": np.array([int(self.fake_quant_enabled)], np.uint8),
                "static_enabled": np.array([int(self.observer_enabled)], np.uint8),
                "learning_enabled": np.array([int(self.learning_enabled)], np.uint8),
                "eps": np.array([self.eps], _F32),
                "scale": self.scale.copy(),
                "zero_point": self.zero_point.copy(),
            }
        )

    _FLAG_KEYS = {
        "fake_quant_enabled": "fake_quant_enabled",
        "static_enabled": "observer_enabled",
        "learning_enabled": "learning_enabled",
    }
    #: torch's ``_LearnableFakeQuantize`` also saves ``FakeQuantizeBase``'s ``observer_enabled``,
    #: which its forward never reads (``static_enabled`` is the observer switch): accepted,
    #: ignored; ``eps`` is read by :meth:`load_state_dict` itself
    _EXTRA_KEYS = ("eps", "observer_enabled")

    def load_state_dict(self, state: dict[str, Any], strict: bool = True) -> None:
        """Load :meth:`state_dict` output or torch's ``_LearnableFakeQuantize`` state dict
        (:meth:`FakeQuantize.load_state_dict`'s checks), ``eps`` included: the floor of the
        scale at every forward (a positive float; it was ignored, so a torch state with another
        ``eps`` clamped its scale elsewhere than torch).

        Parameters
        ----------
        state : mapping
        strict : bool, default True
            Reject unexpected keys.
        """
        eps = self.eps
        if "eps" in state:
            e = np.asarray(state["eps"], _F32).reshape(-1)
            if e.size != 1 or not (np.isfinite(e[0]) and e[0] > 0):
                raise ValueError(f"load_state_dict: eps must be one positive float, got {e}")
            eps = e[0]
        super().load_state_dict(state, strict)  # nothing changed on error
        self.eps = _F32(eps)

    def _check_qparams_state(self, state: dict[str, Any]) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`load_state_dict`'s float32 scale and zero point."""
        return VS.check_state_qparams(
            state["scale"], state["zero_point"], qrange=None, per_tensor=False
        )

    def _set_qparams_state(self, scale: np.ndarray, zero_point: np.ndarray) -> None:
        self._set_shape(scale.size)
        self.scale[...], self.zero_point[...] = scale, zero_point
