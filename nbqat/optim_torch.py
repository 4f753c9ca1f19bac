"""torch.optim interoperability of nbqat's optimizers: torch's argument checks, its keyword
options, and state dicts.

torch's optimizers keep one state per parameter tensor (``{"state": {0: {"step", "exp_avg",
"exp_avg_sq"}, ...}, "param_groups": [{..., "params": [0, 1, ...]}]}``); an nbqat optimizer
keeps one per flat buffer, the parameters raveled and concatenated in order. A torch state dict
whose tensors were converted to NumPy (or CPU tensors, read through ``np.asarray``) loads with
:meth:`~nbqat.optim.Adam.load_state_dict` directly (:func:`from_torch_state_dict`), and
:func:`to_torch_state_dict` writes one back for ``torch.optim.<same class>.load_state_dict``
(each array through ``torch.as_tensor``): steps taken after either load continue the other
library's run (torch's ``foreach=False`` arithmetic).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

#: torch 2.13's keyword options and their defaults, per optimizer.
_SGD_OPTIONS = {"maximize": False, "foreach": None, "differentiable": False, "fused": None}
_ADAM_OPTIONS = {
    "amsgrad": False, "maximize": False, "foreach": None, "capturable": False,
    "differentiable": False, "fused": None, "decoupled_weight_decay": False,
}  # fmt: skip
OPTIONS = {
    "SGD": _SGD_OPTIONS,
    "Adam": _ADAM_OPTIONS,
    "AdamW": {**_ADAM_OPTIONS, "decoupled_weight_decay": True},
}
#: What each unsupported option would need, for the message.
_WHY = {
    "amsgrad": "no max_exp_avg_sq buffer is kept",
    "maximize": "the update descends; negate the loss (or the gradients) to ascend",
    "capturable": "the step is no CUDA-graph capturable torch kernel",
    "differentiable": "the step is not differentiated (no autograd)",
    "foreach": "the step is one fused pass with the arithmetic of torch's foreach=False",
    "fused": "the step is one fused pass with the arithmetic of torch's fused=False",
}
#: Options that pick torch's kernels only: a state saved with them loads as any other.
_KERNEL_ONLY = ("foreach", "fused", "capturable", "differentiable")


def real(value: Any, name: str) -> float:
    """``float(value)`` of a real number (not a string or bool: torch's comparisons refuse a
    string, and ``True`` as a rate is a mistake)."""
    if isinstance(value, (str, bytes, bool, np.bool_)):
        raise TypeError(f"{name} must be a float, got {type(value).__name__} {value!r}")
    try:
        return float(value)
    except (TypeError, ValueError):
        raise TypeError(f"{name} must be a float, got {type(value).__name__}") from None


def hparam(value: Any, name: str, lo: float = 0.0, hi: float | None = None) -> float:
    """A finite hyper-parameter in ``[lo, hi)`` (torch accepts an infinite one, whose first
    step writes Inf / NaN into the parameters: refused here)."""
    v = real(value, name)
    if not (math.isfinite(v) and v >= lo and (hi is None or v < hi)):
        rng = f"in [{lo}, {hi})" if hi is not None else f">= {lo}"
        raise ValueError(f"Invalid {name}: {value!r} (must be {rng})")
    return v


def check_torch_options(optimizer: Any, options: Mapping[str, Any], loading: bool = False) -> None:
    """Refuse torch keyword options that nbqat's update does not implement.

    Parameters
    ----------
    optimizer : SGD, Adam or AdamW
        The optimizer (its class names the options and their defaults).
    options : mapping
        torch's keyword options (``amsgrad``, ``maximize``, ``foreach``, ``fused``,
        ``capturable``, ``differentiable``, ``decoupled_weight_decay``) as given.
    loading : bool, default False
        Options of a torch state dict: those that pick kernels only are taken as they are.

    Raises
    ------
    TypeError
        An option the torch class does not have (as Python's for an unknown keyword).
    ValueError
        An option set to what nbqat does not implement, naming it and the value to pass.
    """
    who = type(optimizer).__name__
    defaults = OPTIONS[who]
    for name, value in options.items():
        if name not in defaults:
            raise TypeError(f"{who}() got an unexpected keyword argument {name!r}")
        default = defaults[name]
        if bool(value) == bool(default) or (loading and name in _KERNEL_ONLY):
            continue
        if name == "decoupled_weight_decay":
            fix = "use nbqat.AdamW" if value else "use nbqat.Adam"
            raise ValueError(f"{who}: decoupled_weight_decay={value!r} is not {who}'s; {fix}")
        raise ValueError(
            f"{who}: {name}={value!r} is not supported ({_WHY[name]}); pass {name}={default!r}"
        )


def from_torch_state_dict(optimizer: Any, state_dict: Mapping[str, Any]) -> dict[str, Any]:
    """An nbqat state dict for ``optimizer`` from a torch.optim one of the same class.

    Parameters
    ----------
    optimizer : SGD, Adam or AdamW
        Over the flat buffer of torch's parameters (``params`` of one group, raveled and
        concatenated in order).
    state_dict : dict
        ``torch.optim.<class>(...).state_dict()`` with NumPy arrays (or CPU tensors) for
        tensors: ``{"state": {i: {...}}, "param_groups": [{..., "params": [ids]}]}``.

    Returns
    -------
    dict
        What :meth:`optimizer.state_dict` would hold (``step`` 0 for SGD: torch keeps none);
        the state buffers in ``optimizer.params``' dtype (torch casts them to its parameters').

    Raises
    ------
    ValueError
        Several param groups (or an optimizer with extra ones, whose state it would wipe),
        missing hyper-parameters, an option nbqat does not implement (``amsgrad``,
        ``maximize``), parameters at other steps or only some with a state, or state buffers
        whose sizes do not add up to ``optimizer.params``.
    """
    who = type(optimizer).__name__
    groups = state_dict["param_groups"]
    if len(groups) != 1 or optimizer._groups:  # torch refuses another group count too
        raise ValueError(
            f"{who}.load_state_dict: torch's state_dict has {len(groups)} param group(s), this "
            f"optimizer {1 + len(optimizer._groups)}; an nbqat optimizer's group 0 is one flat "
            "buffer: save torch's optimizer over one group and load it before add_param_group"
        )
    group = groups[0]
    lacking = [k for k in optimizer._hparam_names if k not in group]
    if lacking:
        raise ValueError(f"{who}.load_state_dict: torch's param group lacks {lacking}")
    check_torch_options(optimizer, {k: group[k] for k in OPTIONS[who] if k in group}, True)
    per = [state_dict["state"].get(i, {}) for i in group["params"]]
    out: dict[str, Any] = {"type": who, **{k: group[k] for k in optimizer._hparam_names}}
    out["step"] = _common_step(per, who) if "Adam" in who else 0
    for name in optimizer._state_names:
        have = [name in s for s in per]
        if any(have) and not all(have):
            raise ValueError(
                f"{who}.load_state_dict: only {sum(have)} of torch's {len(per)} parameters hold "
                f"{name!r} (some never had a gradient); nbqat keeps one state for all of them"
            )
        if all(have) and per:
            # cast to the parameters' dtype, as torch's load_state_dict casts floating state
            buf = np.concatenate([np.ravel(np.asarray(s[name])) for s in per])
            out[name] = buf.astype(np.dtype(optimizer.params.dtype), copy=False)
            if out[name].size != np.shape(optimizer.params)[0]:
                raise ValueError(
                    f"{who}.load_state_dict: torch's {name!r} holds {out[name].size} values, "
                    f"the optimizer's flat buffer {np.shape(optimizer.params)[0]}"
                )
    return out


def _common_step(per: Sequence[Mapping[str, Any]], who: str) -> int:
    """The one step count of every parameter's state (0 without any)."""
    steps = {float(np.asarray(s["step"])) for s in per if "step" in s}
    if len(steps) > 1 or any("step" not in s for s in per) and steps:
        raise ValueError(
            f"{who}.load_state_dict: torch's parameters are at different steps "
            f"{sorted(steps)} (or some have none); nbqat keeps one step count for all of them"
        )
    return int(steps.pop()) if steps else 0


def to_torch_state_dict(optimizer: Any, shapes: Sequence[Sequence[int]]) -> dict[str, Any]:
    """A torch.optim state dict (NumPy arrays) of an nbqat optimizer's flat buffer.

    Parameters
    ----------
    optimizer : SGD, Adam or AdamW
        Without extra parameter groups.
    shapes : sequence of tuple of int
        The shapes of torch's parameters, in order; their sizes add up to the buffer's.

    Returns
    -------
    dict
        ``{"state": {i: {...}}, "param_groups": [{<hyper-parameters>, <options>, "params":
        [0, ..., len(shapes) - 1]}]}``; Adam's ``step`` a float32 scalar array, as torch's.
        Convert each array with ``torch.as_tensor`` before ``torch_optimizer.load_state_dict``.

    Raises
    ------
    ValueError
        Sizes that do not add up to the buffer's, or an optimizer with extra groups.
    """
    who = type(optimizer).__name__
    sd = optimizer.state_dict()
    sizes = [int(np.prod(s)) for s in shapes]
    if sum(sizes) != np.shape(optimizer.params)[0] or "param_groups" in sd:
        raise ValueError(
            f"to_torch_state_dict: shapes of {sum(sizes)} values for a buffer of "
            f"{np.shape(optimizer.params)[0]}, or extra param groups (torch's state_dict "
            "holds one group here)"
        )
    state: dict[int, dict[str, Any]] = {}
    off = 0
    for i, (shape, n) in enumerate(zip(shapes, sizes)):
        entry = {k: sd[k][off : off + n].reshape(shape) for k in optimizer._state_names if k in sd}
        if "Adam" in who and sd["step"]:
            entry = {"step": np.array(sd["step"], np.float32), **entry}
        if entry:
            state[i] = entry
        off += n
    group = {k: sd[k] for k in optimizer._hparam_names}
    group.update(OPTIONS[who], params=list(range(len(sizes))))
    return {"state": state, "param_groups": [group]}
