"""Fused optimizers over one flat parameter buffer: SGD (momentum, Nesterov), Adam, AdamW.

Each ``step`` is one compiled elementwise pass (a ``@cuda.jit`` twin for CUDA buffers) with the
maths of ``torch.optim`` (single-tensor, ``foreach=False``) in the buffer's dtype. ``step`` takes
``grad_scale``: every gradient is multiplied by it inside the update, which is how gradient
clipping folds in (llm.c style)::

    total = nbqat.get_total_norm(grads)
    opt.step(grads, grad_scale=nbqat.clip.clip_coef(total, max_norm, grads.dtype))

gives the same bits as ``clip_grad_norm_(grads, max_norm); opt.step(grads)`` (the coefficient
computed in the gradients' dtype, as torch computes it; ``clip_coef``'s default is float32) but
reads the gradients once less and leaves them unscaled.

Parameter groups (torch's ``param_groups`` / ``add_param_group``): the flat buffer is group 0;
:meth:`~_Optimizer.add_param_group` adds a group of other parameters -- e.g. the LSQ scales and
zero points of a QAT model (:meth:`nbqat.nn.QATModel.quantizer_param_group`) -- with their own
hyper-parameters (default: the optimizer's) and their own state. A group's ``"params"`` is a
:class:`ParamSource`: ``gather()`` returns its parameters and gradients as two flat arrays,
``scatter(flat)`` writes updated values back; :class:`ArrayGroup` is one over a list of arrays.
Each ``step`` updates every group with the same update rule and ``grad_scale`` (so clipping
covers them together).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from nbqat import _cuda
from nbqat._jit import threads_for
from nbqat._validate import check_int, partial_overlap, writeable
from nbqat.kernels import optim_cpu as _k
from nbqat.optim_groups import ArrayGroup, ParamGroups, ParamSource, _Group
from nbqat.optim_torch import check_torch_options, from_torch_state_dict
from nbqat.optim_torch import hparam as _hparam
from nbqat.optim_torch import real as _real

_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))


def _check_params(params: Any) -> bool:
    """Validate the flat parameter buffer; returns True for a CUDA buffer."""
    is_cuda = _cuda.is_cuda_array(params)
    if not is_cuda and not isinstance(params, np.ndarray):
        raise TypeError(f"params must be one flat NumPy or CUDA array, got {type(params).__name__}")
    if is_cuda:
        _cuda.require_cuda("optimizer")
    dt = np.dtype(params.dtype)
    if dt not in _DTYPES:
        raise TypeError(
            f"params has dtype {dt}; optimizers support float32 and float64 "
            "(convert with .astype(np.float32))"
        )
    if len(params.shape) != 1:
        raise ValueError(f"params must be 1-D (one flat buffer), got shape {params.shape}")
    contiguous = params.is_c_contiguous() if is_cuda else params.flags.c_contiguous
    if not contiguous:
        raise ValueError("params must be contiguous (np.ascontiguousarray)")
    if not is_cuda and not params.flags.writeable:
        raise ValueError("params is read-only; the optimizer updates it in place")
    return is_cuda


class _Optimizer(ParamGroups):
    """Shared machinery: the parameter buffer, state buffers, validation of ``grads``."""

    _state_names: tuple[str, ...] = ()
    _hparam_names: tuple[str, ...] = ()
    #: buffers every step creates: a state past step 0 must hold them
    _state_after_step: tuple[str, ...] = ()

    def __init__(self, params: Any) -> None:
        self._cuda = _check_params(params)
        self.params = params
        self.step_count = 0
        self._buffers: dict[str, Any] = {}
        self._groups: list[_Group] = []

    # -- buffers ---------------------------------------------------------------------------
    def _zeros(self) -> Any:
        if self._cuda:
            from nbqat.kernels import optim_cuda

            return optim_cuda.zeros(self.params.shape[0], self.params.dtype)
        return np.zeros(self.params.shape[0], self.params.dtype)

    def _buffer(self, name: str) -> Any:
        if name not in self._buffers:
            self._buffers[name] = self._zeros()
        return self._buffers[name]

    def _check_grads(self, grads: Any, grad_scale: Any) -> float:
        on_device = _cuda.is_cuda_array(grads)
        if self._cuda != on_device or not (self._cuda or isinstance(grads, np.ndarray)):
            raise TypeError(
                "grads must be an array on the same device as params "
                f"({'CUDA' if self._cuda else 'NumPy'}), got {type(grads).__name__}"
            )
        if tuple(grads.shape) != tuple(self.params.shape) or np.dtype(grads.dtype) != np.dtype(
            self.params.dtype
        ):
            raise ValueError(
                f"grads must match params: shape {tuple(self.params.shape)} dtype "
                f"{np.dtype(self.params.dtype)}, got shape {tuple(grads.shape)} dtype "
                f"{np.dtype(grads.dtype)}"
            )
        contiguous = grads.is_c_contiguous() if self._cuda else grads.flags.c_contiguous
        if not contiguous:
            raise ValueError("grads must be contiguous (np.ascontiguousarray)")
        if partial_overlap(grads, self.params, self._cuda):  # a race in the parallel pass
            raise ValueError(
                "grads overlaps params without being the same array (views of one buffer at "
                "different offsets): the update would read gradients it has overwritten; pass "
                "a copy (grads.copy()), as torch refuses such an in-place update"
            )
        if not (self._cuda or writeable(self.params)):  # made read-only since: a Numba
            raise ValueError(  # TypingError in the kernel, after the state buffers were made
                "params is read-only (it, or the buffer it views, was made so since the "
                "construction); the optimizer updates it in place: .flags.writeable = True"
            )
        gs = _real(grad_scale, "grad_scale")
        if gs < 0 or gs == math.inf:  # NaN passes: clip_coef of a non-finite norm, as in torch
            raise ValueError(
                f"grad_scale must be a finite factor >= 0 (e.g. nbqat.clip.clip_coef), got {gs}"
            )
        return gs

    def _t(self, x: float) -> Any:
        """A scalar of the parameters' dtype."""
        return np.dtype(self.params.dtype).type(x)

    # -- state -----------------------------------------------------------------------------
    def zero_state(self) -> None:
        """Forget the optimizer state: step count 0, moment buffers cleared."""
        self.step_count = 0
        self._buffers.clear()
        for g in self._groups:
            g.inner = None

    def state_dict(self) -> dict[str, Any]:
        """Step count, hyper-parameters and state buffers (NumPy copies).

        Returns
        -------
        dict
            ``{"type", "step", <hyper-parameters>, <buffers>}``; buffers not yet created are
            absent.
        """
        out: dict[str, Any] = {"type": type(self).__name__, "step": self.step_count}
        for k in self._hparam_names:
            out[k] = getattr(self, k)
        for k, b in self._buffers.items():
            out[k] = b.copy_to_host() if self._cuda else b.copy()
        if self._groups:
            out["param_groups"] = [
                {
                    "hparams": dict(g.hparams),
                    "state": None if g.inner is None else g.inner.state_dict(),
                }
                for g in self._groups
            ]
        return out

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a :meth:`state_dict` (validated fully before anything changes).

        Parameters
        ----------
        state : dict
            A dict from :meth:`state_dict` of the same optimizer type and buffer size, or
            torch.optim's of the same class in NumPy (:mod:`nbqat.optim_torch`).

        Raises
        ------
        ValueError
            Another optimizer type, missing keys, buffers of the wrong shape/dtype (or Adam's
            moments missing from a state past step 0), or another number of parameter groups
            (add them with :meth:`add_param_group` first).
        """
        if "state" in state and "param_groups" in state:  # torch.optim's layout
            state = from_torch_state_dict(self, state)
        if state.get("type", type(self).__name__) != type(self).__name__:
            raise ValueError(f"state_dict is for {state.get('type')}, not {type(self).__name__}")
        missing = [k for k in ("step", *self._hparam_names) if k not in state]
        if missing:
            raise ValueError(f"state_dict lacks {missing}")
        try:  # 2.7 was truncated to 2 (and "3" or True taken as steps)
            step = check_int(state["step"], "state_dict step")
        except TypeError as e:
            raise ValueError(str(e)) from None
        if step < 0:
            raise ValueError(f"state_dict step must be >= 0, got {step}")
        bufs = {}
        for k in self._state_names:
            if k in state:
                b = np.asarray(state[k])
                if b.shape != tuple(self.params.shape) or b.dtype != np.dtype(self.params.dtype):
                    raise ValueError(
                        f"state_dict[{k!r}] has shape {b.shape} dtype {b.dtype}, expected "
                        f"{tuple(self.params.shape)} {np.dtype(self.params.dtype)}"
                    )
                bufs[k] = b
        lacking = [k for k in self._state_after_step if step and k not in bufs]
        if lacking:  # zero moments at step 6 are neither the run's nor a fresh start's
            raise ValueError(f"state_dict has step {step} but lacks {lacking}")
        hp = {k: state[k] for k in self._hparam_names}
        # validated and converted as the constructor does (a float32 lr kept as np.float32 made
        # the step sizes float32 arithmetic: other bits than the optimizer built with that lr)
        probe = type(self)(np.zeros(0, np.dtype(self.params.dtype)), **hp)
        hp = probe.hparams()
        groups = self._checked_groups(state.get("param_groups"))
        for grp, (ghp, inner) in zip(self._groups, groups):
            grp.hparams, grp.inner = ghp, inner
        for k, v in hp.items():
            setattr(self, k, v)
        self.step_count = step
        self._buffers.clear()
        for k, b in bufs.items():
            if self._cuda:
                from nbqat.kernels import optim_cuda

                self._buffers[k] = optim_cuda.to_device(np.ascontiguousarray(b))
            else:
                self._buffers[k] = np.array(b, copy=True)

    def _validate(self, **hp: Any) -> None:  # pragma: no cover - overridden
        raise NotImplementedError

    def step(self, grads: Any, grad_scale: float = 1.0) -> None:
        """One fused update.

        Parameters
        ----------
        grads : (n,) array
            The flat gradient buffer: same shape, dtype and device as ``params``; read only.
        grad_scale : float, default 1.0
            Every gradient is multiplied by it (rounded to the dtype) inside the update: pass
            :func:`nbqat.clip.clip_coef` to fold gradient clipping in. Finite and >= 0; NaN
            (the coefficient of a non-finite gradient norm) is taken and propagates, as in
            torch.

        Raises
        ------
        TypeError, ValueError
            ``grads`` on another device, of another shape/dtype, or not contiguous; a
            ``grad_scale`` that is not a number, negative or infinite; ``params`` made
            read-only since the construction; a hyper-parameter set since to a value the
            constructor refuses (``opt.lr = float("inf")``, a string). Nothing changes then.
        """
        gs = self.check_step(grads, grad_scale)
        groups = self._step_groups(gs)
        self._update(grads, gs)
        self.step_count += 1
        groups()

    def check_step(self, grads: Any, grad_scale: Any = 1.0) -> float:
        """Check :meth:`step`'s arguments and the hyper-parameters; nothing is updated.

        Parameters
        ----------
        grads, grad_scale
            As :meth:`step`.

        Returns
        -------
        float
            ``grad_scale`` as a float.

        Raises
        ------
        TypeError, ValueError
            As :meth:`step` (the extra parameter groups are checked there).
        """
        self._validate(**self.hparams())  # opt.lr = ... since (a schedule), as the groups'
        return self._check_grads(grads, grad_scale)

    def _update(self, grads: Any, gs: float) -> None:  # pragma: no cover - overridden
        """The subclass's fused kernel launch for step ``step_count + 1`` (validated inputs)."""
        raise NotImplementedError

    def _launch(self, kernel: str, args: tuple) -> None:
        """Run the fused update ``kernel`` of :mod:`nbqat.kernels.optim_cpu` (or, for a CUDA
        buffer, its twin in :mod:`nbqat.kernels.optim_cuda`)."""
        if self._cuda:
            from nbqat.kernels import optim_cuda

            getattr(optim_cuda, kernel)(*args)
        else:
            with threads_for(self.params.shape[0]):
                getattr(_k, kernel)(*args)


class SGD(_Optimizer):
    """Stochastic gradient descent with optional momentum, dampening, Nesterov and L2 decay.

    Same update as ``torch.optim.SGD`` (``foreach=False``, ``maximize=False``)::

        g = grad * grad_scale;  g += weight_decay * p
        buf = g (first step) | buf * momentum + (1 - dampening) * g
        g = g + momentum * buf (nesterov) | buf
        p -= lr * g

    Parameters
    ----------
    params : (n,) float32 or float64 NumPy or CUDA array
        The flat parameter buffer, updated in place.
    lr : float, default 1e-3
        Learning rate, ``>= 0`` (torch 2.13's default).
    momentum, dampening, weight_decay : float, default 0
        ``>= 0``.
    nesterov : bool, default False
        Requires ``momentum > 0`` and ``dampening == 0``.
    **torch_options
        torch's ``maximize``, ``foreach``, ``differentiable``, ``fused`` at their defaults
        (False or None): the update is theirs (:func:`nbqat.optim_torch.check_torch_options`).

    Raises
    ------
    TypeError, ValueError
        Bad buffer or hyper-parameters (torch's checks); another torch option, or one set to
        what nbqat does not implement (naming it).

    References
    ----------
    ``torch.optim.SGD`` (torch 2.13); Sutskever et al., ICML 2013 (Nesterov momentum).
    """

    _state_names = ("momentum_buffer",)
    _hparam_names = ("lr", "momentum", "dampening", "weight_decay", "nesterov")

    def __init__(
        self,
        params: Any,
        lr: float = 1e-3,
        momentum: float = 0.0,
        dampening: float = 0.0,
        weight_decay: float = 0.0,
        nesterov: bool = False,
        **torch_options: Any,
    ) -> None:
        self._validate(lr, momentum, dampening, weight_decay, nesterov)
        check_torch_options(self, torch_options)
        super().__init__(params)
        self.lr, self.momentum, self.dampening = float(lr), float(momentum), float(dampening)
        self.weight_decay, self.nesterov = float(weight_decay), bool(nesterov)
        self.defaults = self.hparams()  # torch's: what add_param_group fills in

    def _validate(self, lr=0.0, momentum=0.0, dampening=0.0, weight_decay=0.0, nesterov=False):
        _hparam(lr, "learning rate")
        _hparam(momentum, "momentum value")
        _hparam(dampening, "dampening value", lo=-math.inf)
        _hparam(weight_decay, "weight_decay value")
        if nesterov and (float(momentum) <= 0 or float(dampening) != 0):
            raise ValueError("Nesterov momentum requires a momentum and zero dampening")

    def _update(self, grads: Any, gs: float) -> None:
        t = self._t
        first = "momentum_buffer" not in self._buffers
        buf = self._buffer("momentum_buffer") if self.momentum != 0 else self.params[:0]
        args = (
            self.params, grads, buf, t(gs), t(-self.lr), t(self.momentum),
            t(1.0 - self.dampening), t(self.weight_decay), self.nesterov, first, gs != 1.0,
        )  # fmt: skip
        self._launch("sgd_step", args)


class Adam(_Optimizer):
    """Adam with optional L2 weight decay (``torch.optim.Adam``, amsgrad=False, foreach=False).

    ::

        g = grad * grad_scale (+ weight_decay * p)
        m = lerp(m, g, 1 - beta1);  v = v * beta2 + (1 - beta2) * g * g
        p -= lr / (1 - beta1**t) * m / (sqrt(v) / sqrt(1 - beta2**t) + eps)

    Parameters
    ----------
    params : (n,) float32 or float64 NumPy or CUDA array
        The flat parameter buffer, updated in place.
    lr : float, default 1e-3
    betas : (float, float), default (0.9, 0.999)
        Each in [0, 1).
    eps : float, default 1e-8
    weight_decay : float, default 0
    amsgrad : bool, default False
        torch's sixth positional argument; True raises a ValueError (no ``max_exp_avg_sq``).
    **torch_options
        torch's ``maximize``, ``foreach``, ``capturable``, ``differentiable``, ``fused``,
        ``decoupled_weight_decay`` at their defaults; any other value raises a ValueError
        naming it (:func:`nbqat.optim_torch.check_torch_options`).

    Notes
    -----
    Matches torch's CPU kernels operation by operation, fused multiply-adds included; torch's
    vectorised ``sqrt`` (SLEEF on AVX-512 builds) is not always correctly rounded while this one
    is, so parameters can differ from torch's in the last bit of an update (moments are
    bit-identical without weight decay).

    References
    ----------
    Kingma & Ba, "Adam: A Method for Stochastic Optimization", ICLR 2015; ``torch.optim.Adam``.
    """

    _state_names = ("exp_avg", "exp_avg_sq")
    _state_after_step = _state_names
    _hparam_names = ("lr", "betas", "eps", "weight_decay")
    _decoupled = False

    def __init__(
        self,
        params: Any,
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
        amsgrad: bool = False,
        **torch_options: Any,
    ) -> None:
        self._validate(lr, betas, eps, weight_decay)
        check_torch_options(self, {"amsgrad": amsgrad, **torch_options})
        super().__init__(params)
        self.lr, self.eps, self.weight_decay = float(lr), float(eps), float(weight_decay)
        self.betas = (float(betas[0]), float(betas[1]))
        self.defaults = self.hparams()  # torch's: what add_param_group fills in

    def _validate(self, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0):
        _hparam(lr, "learning rate")
        _hparam(eps, "epsilon value")
        try:
            b1, b2 = betas
        except (TypeError, ValueError):
            raise TypeError(f"betas must be a pair of floats, got {betas!r}") from None
        _hparam(b1, "beta parameter at index 0", hi=1.0)
        _hparam(b2, "beta parameter at index 1", hi=1.0)
        _hparam(weight_decay, "weight_decay value")

    def _update(self, grads: Any, gs: float) -> None:
        t = self._t
        b1, b2 = self.betas
        step = self.step_count + 1  # the step being taken (torch's ``state["step"]``)
        bc1 = 1 - b1 ** float(step)
        bc2 = 1 - b2 ** float(step)
        w1 = t(1 - b1)
        decoupled = self._decoupled and self.weight_decay != 0
        args = (
            self.params, grads, self._buffer("exp_avg"), self._buffer("exp_avg_sq"), t(gs), w1,
            t(1) - w1, t(b2), t(1 - b2), t(0.0 if self._decoupled else self.weight_decay),
            t(1 - self.lr * self.weight_decay), t(bc2**0.5), t(self.eps), t(-(self.lr / bc1)),
            decoupled, gs != 1.0,
        )  # fmt: skip
        self._launch("adam_step", args)


class AdamW(Adam):
    """AdamW: Adam with decoupled weight decay (``torch.optim.AdamW``, foreach=False).

    Identical to :class:`Adam` except that ``p *= 1 - lr * weight_decay`` before the update
    instead of adding ``weight_decay * p`` to the gradient.

    Parameters
    ----------
    params : (n,) float32 or float64 NumPy or CUDA array
        The flat parameter buffer, updated in place.
    lr : float, default 1e-3
    betas : (float, float), default (0.9, 0.999)
    eps : float, default 1e-8
    weight_decay : float, default 1e-2
        Decoupled decay coefficient.
    amsgrad : bool, default False
        As :class:`Adam`'s.
    **torch_options
        As :class:`Adam`'s (``decoupled_weight_decay`` True, torch's AdamW default).

    References
    ----------
    Loshchilov & Hutter, "Decoupled Weight Decay Regularization", ICLR 2019; ``torch.optim.AdamW``.
    """

    _decoupled = True

    def __init__(
        self,
        params: Any,
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 1e-2,
        amsgrad: bool = False,
        **torch_options: Any,
    ) -> None:
        super().__init__(params, lr, betas, eps, weight_decay, amsgrad, **torch_options)


__all__ = ["SGD", "Adam", "AdamW", "ArrayGroup", "ParamSource"]
