"""What :class:`nbqat.FakeQuantize` and :class:`nbqat.LearnableFakeQuantize` share: the phase
switches and ``with_args`` (torch's ``FakeQuantizeBase``), the observer they wrap, the saved
context of the last forward and the state-dict plumbing around the observer's state."""

from __future__ import annotations

import copy
import itertools
import math
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any

import numpy as np

from nbqat._validate import QUANT_BOUND
from nbqat.quantization import _validate_state as VS
from nbqat.quantization.observers import _MinMaxBase, _PartialWrapper, _with_args

_CACHED = object()  # default of backward's ctx: "use the ctx of the last forward"
_OBS_PREFIX = "activation_post_process."


def _make_observer(observer: Any, kwargs: dict[str, Any], who: str) -> _MinMaxBase:
    VS.check_factory(observer, _MinMaxBase, who)
    obs = observer(**kwargs)
    VS.check_built(obs, _MinMaxBase, who)
    return obs


def _numel(x: Any) -> int:
    """The element count of an array, CUDA device array or array-like (not copied)."""
    shape = getattr(x, "shape", None)
    return math.prod(np.shape(x) if shape is None else shape)


def _axis(ch_axis: int | None) -> int:
    """The channel axis of a per-channel quantizer (never None there)."""
    if ch_axis is None:  # pragma: no cover - guarded by is_per_channel
        raise ValueError("per-channel fake quantization needs ch_axis")
    return ch_axis


def _switch(what: str, on_doc: str, off_doc: str) -> tuple[Any, Any]:
    """torch's ``enable_<what>(enabled=True)`` / ``disable_<what>()`` pair of methods over the
    bool attribute ``<what>_enabled`` (``disable_<what>`` calls ``enable_<what>(False)``)."""
    flag, on_name = f"{what}_enabled", f"enable_{what}"

    def enable(self: Any, enabled: bool = True) -> None:
        setattr(self, flag, bool(enabled))

    def disable(self: Any) -> None:
        getattr(self, on_name)(False)

    enable.__doc__ = f"""{on_doc}

        Parameters
        ----------
        enabled : bool, default True
        """
    disable.__doc__ = off_doc
    for fn, name in ((enable, on_name), (disable, f"disable_{what}")):
        fn.__name__, fn.__qualname__ = name, f"_QuantizerPhases.{name}"
    return enable, disable


class UncalibratedError(RuntimeError, ValueError):
    """A quantizer has never observed data (no qparams yet): raised by :func:`check_observed`
    for the integer conversion (``to_int8()`` / ``convert()``) and the ONNX export alike. A
    RuntimeError (a state error) and a ValueError (the argument's value) at once."""


def is_observed(fq: Any) -> bool:
    """Whether the quantizer ``fq`` has qparams from observed data.

    Parameters
    ----------
    fq : quantizer
        A FakeQuantize-family module (or any object with ``activation_post_process``).

    Returns
    -------
    bool
        False when its observer's ``min_val`` is empty or not finite (a min/max observer that
        has seen no element), or when a grouped quantizer (``group_size``) has no
        ``block_size`` yet; True otherwise (a quantizer without min/max statistics: dynamic
        per-token, float8 with a fixed scale, LSQ).
    """
    if hasattr(fq, "group_size") and getattr(fq, "block_size", None) is None:
        return False
    obs = getattr(fq, "activation_post_process", None)
    mn = getattr(obs, "min_val", None)
    if mn is None:
        return True
    mn = np.asarray(mn, dtype=np.float64)
    return mn.size > 0 and bool(np.all(np.isfinite(mn)))


def check_observed(quantizers: Mapping[str, Any]) -> None:
    """Raise unless every quantizer has observed data (:func:`is_observed`).

    Parameters
    ----------
    quantizers : mapping of str to quantizer
        By name (``"<module path>.<hook>"``); None values are skipped.

    Raises
    ------
    UncalibratedError
        Naming the first quantizer that has never observed data (and how many more).
    """
    never = [n for n, fq in quantizers.items() if fq is not None and not is_observed(fq)]
    if never:
        more = f"; {len(never) - 1} more" if len(never) > 1 else ""
        raise UncalibratedError(
            f"quantizer {never[0]!r} is uncalibrated (it has never observed data{more}): "
            "calibrate the QAT model first (qat.calibrate(batches)), then freeze it "
            "(qat.freeze_observers()) before to_int8() / convert() / to_onnx()"
        )


class RemovableHandle:
    """What :meth:`register_forward_pre_hook` returns: ``handle.remove()`` unregisters the
    hook (torch's ``torch.utils.hooks.RemovableHandle``); also a context manager that removes
    it on exit.

    Parameters
    ----------
    hooks : dict
        The quantizer's hook table the hook was added to.
    """

    _ids = itertools.count()

    def __init__(self, hooks: dict[int, Any]) -> None:
        self.hooks = hooks
        self.id = next(RemovableHandle._ids)

    def remove(self) -> None:
        """Unregister the hook (a second call does nothing)."""
        self.hooks.pop(self.id, None)

    def __enter__(self) -> RemovableHandle:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.remove()


class _QuantizerPhases:
    """The phase switches and ``with_args`` shared by :class:`FakeQuantize` and
    :class:`LearnableFakeQuantize` (torch's names; ``torch.ao.quantization.FakeQuantizeBase``)."""

    observer_enabled: bool
    fake_quant_enabled: bool

    @classmethod
    def with_args(cls, **kwargs: Any) -> _PartialWrapper:
        """A factory of this module with these keyword arguments (torch's ``with_args``).

        Parameters
        ----------
        **kwargs
            Constructor arguments (``observer=...``, ``quant_min=...``, observer arguments).

        Returns
        -------
        callable
            Each call builds a new, independent module (a :class:`QConfig` holds these).
        """
        return _with_args(cls, **kwargs)

    enable_observer, disable_observer = _switch(
        "observer",
        "Turn statistics collection (and qparams recomputation) on or off.",
        "Freeze the observer (and so scale / zero_point).",
    )
    enable_fake_quant, disable_fake_quant = _switch(
        "fake_quant",
        "Turn fake quantization on or off (off: forward returns x).",
        "Pass inputs through unchanged (statistics may still be collected).",
    )

    # -- what both quantizers do the same way ------------------------------------------------
    activation_post_process: _MinMaxBase
    ctx: Any
    _ran: bool

    def __call__(self, x: Any) -> Any:
        return self.forward(x)  # type: ignore[attr-defined]

    #: The registered forward pre-hooks by handle id (none: the class's empty mapping).
    _forward_pre_hooks: Mapping[int, Callable[..., Any]] = MappingProxyType({})

    def register_forward_pre_hook(self, hook: Callable[..., Any]) -> RemovableHandle:
        """Call ``hook(module, (x,))`` at the start of every :meth:`forward` (torch's
        ``nn.Module.register_forward_pre_hook``).

        Parameters
        ----------
        hook : callable
            ``hook(module, args) -> None or modified input``: ``args`` is the tuple ``(x,)``
            of the forward's input; a return value other than None replaces the input (a
            1-tuple or the array itself). Hooks run in registration order.

        Returns
        -------
        RemovableHandle
            ``handle.remove()`` unregisters the hook.

        Raises
        ------
        TypeError
            ``hook`` is not callable.
        """
        if not callable(hook):
            raise TypeError(f"register_forward_pre_hook: hook must be callable, got {hook!r}")
        if not isinstance(self._forward_pre_hooks, dict):  # the first one of this quantizer
            self._forward_pre_hooks = {}
        handle = RemovableHandle(self._forward_pre_hooks)  # type: ignore[arg-type]
        handle.hooks[handle.id] = hook
        return handle

    def _run_forward_pre_hooks(self, x: Any) -> Any:
        """``x`` after every registered pre-hook (called first in each ``forward``)."""
        for hook in tuple(self._forward_pre_hooks.values()):
            out = hook(self, (x,))
            if out is not None:
                x = out[0] if isinstance(out, tuple) else out
        return x

    def _bind_observer(self, observer: Any, observer_kwargs: dict[str, Any]) -> None:
        """Build :attr:`activation_post_process` and copy its range, dtype, qscheme and
        channel axis (``ch_axis`` None per tensor); no forward has run yet."""
        obs = _make_observer(observer, observer_kwargs, type(self).__name__)
        if obs.quant_min < -QUANT_BOUND or obs.quant_max > QUANT_BOUND:  # qint32's range
            raise ValueError(
                f"{type(self).__name__}: the observer's range [{obs.quant_min}, "
                f"{obs.quant_max}] ({obs.dtype}) is past [-2**24, 2**24], where float32 fake "
                "quantization is not exact (as fake_quantize_per_tensor_affine refuses it); "
                "use an 8- or 16-bit dtype or a narrower quant_min / quant_max"
            )
        self.activation_post_process = obs
        self.quant_min, self.quant_max = obs.quant_min, obs.quant_max
        self.dtype, self.qscheme = obs.dtype, obs.qscheme
        self.is_per_channel = str(obs.qscheme).startswith("per_channel")  # torch's rule
        self.ch_axis = obs.ch_axis if self.is_per_channel else None
        self.observer_enabled = True
        self.fake_quant_enabled = True
        self.ctx = None
        self._ran = False

    def _observe_empty(self, x: Any) -> bool:
        """An empty batch (no element): the observer sees it (validation, and its part in a
        data-parallel collective); True when that changed the observer's min/max (other ranks'
        data), so the qparams must follow. A lone empty batch changes nothing (torch's fix)."""
        if not self.observer_enabled:
            return False
        obs = self.activation_post_process
        before = (obs.min_val.copy(), obs.max_val.copy())
        obs(x)
        after = (obs.min_val, obs.max_val)
        return not all(np.array_equal(a, b, equal_nan=True) for a, b in zip(before, after))

    def _empty_result(self, x: Any) -> tuple[Any, Any]:
        """``(y, mask)`` of an empty ``x``: empty arrays of its shape (CPU or CUDA), validated
        as any input (the per-tensor function: the qparams' length has no meaning here, and a
        per-channel quantizer has no channel count before its first non-empty batch)."""
        from nbqat.quantization import fake_quant as _fq

        return _fq.fake_quantize_per_tensor_affine_cachemask(
            x, np.float32(1.0), 0, self.quant_min, self.quant_max
        )

    def _saved_ctx(self, ctx: Any) -> Any:
        """``ctx`` itself, or the last forward's for :data:`_CACHED` (RuntimeError before any
        forward)."""
        if ctx is _CACHED:
            if not self._ran:
                raise RuntimeError(f"{type(self).__name__}.backward: call forward first")
            return self.ctx
        return ctx

    def _with_observer_state(self, own: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """``own`` plus the observer's state under ``activation_post_process.*`` (torch's keys)."""
        for k, v in self.activation_post_process.state_dict().items():
            own[_OBS_PREFIX + k] = v
        return own

    #: state-dict key of each phase flag -> the attribute it holds (torch's names).
    _FLAG_KEYS: dict[str, str]
    #: further keys :meth:`state_dict` writes that :meth:`load_state_dict` accepts and ignores.
    _EXTRA_KEYS: tuple[str, ...] = ()

    def _check_qparams_state(self, state: dict[str, Any]) -> tuple[np.ndarray, np.ndarray]:
        raise NotImplementedError  # pragma: no cover - each quantizer checks its own

    def _set_qparams_state(self, scale: np.ndarray, zero_point: np.ndarray) -> None:
        raise NotImplementedError  # pragma: no cover

    def load_state_dict(self, state: dict[str, Any], strict: bool = True) -> None:
        """Load :meth:`state_dict` output; nothing changes unless everything is valid.

        Parameters
        ----------
        state : mapping
        strict : bool, default True
            Reject unexpected keys.

        Raises
        ------
        KeyError
            Missing keys.
        ValueError
            Unexpected keys (strict), wrong shapes, invalid values (flags not 0/1, scales not
            finite and > 0, zero points out of range or not finite).
        TypeError
            A float zero point where the quantizer holds integer ones.
        """
        need = [*self._FLAG_KEYS, "scale", "zero_point"]
        VS.check_state_keys(state, need, self._EXTRA_KEYS, _OBS_PREFIX, strict)
        sub = {k[len(_OBS_PREFIX) :]: v for k, v in state.items() if k.startswith(_OBS_PREFIX)}
        flags = {attr: VS.check_flag(state, key) for key, attr in self._FLAG_KEYS.items()}
        scale, zero_point = self._check_qparams_state(state)
        obs = copy.deepcopy(self.activation_post_process)
        obs.load_state_dict(sub, strict=strict)
        self.activation_post_process = obs
        self._set_qparams_state(scale, zero_point)
        for attr, on in flags.items():
            setattr(self, attr, on)
