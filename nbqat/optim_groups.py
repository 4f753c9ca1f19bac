"""Parameter groups of nbqat's optimizers (torch's ``param_groups`` / ``add_param_group``).

Group 0 is the optimizer's flat buffer. An extra group holds a :class:`ParamSource` (e.g. the
LSQ scales and zero points of a QAT model, :meth:`nbqat.nn.QATModel.quantizer_parameters`)
with its own hyper-parameters and state: at every ``step`` the source's parameters and
gradients are gathered into flat arrays, updated by an optimizer of the same class (the same
fused kernel) with the same ``grad_scale``, and scattered back. A source with an ``arrays()``
method (:class:`ArrayGroup`, the QAT models' quantizer parameters) lists the arrays it
updates: ``add_param_group`` refuses a source that shares memory with group 0's buffer or
another group, as torch refuses a parameter in two groups.
"""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np

from nbqat._validate import first_shared_pair

__all__ = ["ArrayGroup", "ParamGroups", "ParamSource", "load_together"]

_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))


def inner_attribute(name: str) -> Any:
    """A read/write property of an optimizer wrapper that forwards ``name`` to ``self.inner``.

    Parameters
    ----------
    name : str
        The attribute of the wrapped optimizer (e.g. ``"lr"``, which a schedule sets).

    Returns
    -------
    property
    """

    def get(self: Any) -> Any:
        return getattr(self.inner, name)

    def set_(self: Any, value: Any) -> None:
        setattr(self.inner, name, value)

    return property(get, set_, doc=f"The wrapped optimizer's ``{name}`` (read and written).")


def load_together(parts: dict[str, tuple[Any, Any]], what: str, then: Any = None) -> None:
    """``opt.load_state_dict(state)`` for each ``name: (opt, state)`` part, then ``then()``:
    all of it or, on an error, none (every optimizer gets its previous state back).

    Parameters
    ----------
    parts : dict of str to (optimizer, dict or None)
        ``None``: the part is missing from the saved state.
    what : str
        Names the state in the error, e.g. ``"GroupedAdamW state_dict"``.
    then : callable, optional
        The rest of the caller's loading (a KeyError, TypeError or ValueError rolls back too).

    Raises
    ------
    ValueError
        ``what`` does not fit (a missing or malformed part), naming the first problem.
    """
    before = {name: opt.state_dict() for name, (opt, _) in parts.items()}
    try:
        for name, (opt, st) in parts.items():
            if not isinstance(st, dict):
                raise ValueError(f"its {name!r} is {type(st).__name__}, not a state_dict")
            opt.load_state_dict(st)
        if then is not None:
            then()
    except (KeyError, TypeError, ValueError) as e:
        for name, (opt, _) in parts.items():
            opt.load_state_dict(before[name])
        raise ValueError(f"{what} does not fit ({type(e).__name__}: {e}); nothing loaded") from e


class ParamSource(Protocol):
    """What a parameter group's ``"params"`` provides (see the module docstring)."""

    def gather(self) -> tuple[np.ndarray, np.ndarray]:
        """``(params, grads)``: two flat float arrays of one size and dtype (copies)."""
        ...

    def scatter(self, params: np.ndarray) -> None:
        """Write the updated flat ``params`` back into the parameters."""
        ...


class ArrayGroup:
    """A :class:`ParamSource` over NumPy arrays and their gradient arrays.

    Parameters
    ----------
    params, grads : sequence of ndarray
        Pairwise the same shape; all of one float dtype (float32 or float64). The arrays are
        updated in place (they must stay the same objects).

    Raises
    ------
    TypeError
        A non-array or another dtype.
    ValueError
        A different count or shape of gradients; two parameter arrays that share memory; a
        read-only parameter array (here, or at a step's :meth:`gather`, before anything is
        updated).
    """

    def __init__(self, params: Any, grads: Any) -> None:
        params, grads = list(params), list(grads)
        if len(params) != len(grads):
            raise ValueError(f"ArrayGroup: {len(params)} params but {len(grads)} grads")
        for i, (p, g) in enumerate(zip(params, grads)):
            if not (isinstance(p, np.ndarray) and isinstance(g, np.ndarray)):
                raise TypeError(f"ArrayGroup: params[{i}] and grads[{i}] must be NumPy arrays")
            if p.shape != g.shape or p.dtype != g.dtype or p.dtype != params[0].dtype:
                raise ValueError(
                    f"ArrayGroup: params[{i}] {p.dtype}{p.shape} and grads[{i}] "
                    f"{g.dtype}{g.shape} must match (one dtype for the group)"
                )
        pair = first_shared_pair(params)
        if pair is not None:  # gather copies both, scatter keeps the last one's update
            raise ValueError(
                f"ArrayGroup: params[{pair[0]}] and params[{pair[1]}] share memory; list each "
                "parameter once (torch updates a listed-twice parameter twice)"
            )
        self.params, self.grads = params, grads
        self._check_writeable()

    def _check_writeable(self) -> None:
        """ValueError for a read-only parameter array: :meth:`scatter` would fail after the
        optimizer's other groups were updated (a half-applied step)."""
        for i, p in enumerate(self.params):
            if not p.flags.writeable:
                raise ValueError(f"ArrayGroup: params[{i}] is read-only; the step updates it")

    def gather(self) -> tuple[np.ndarray, np.ndarray]:
        """The parameters and gradients, each concatenated into one flat array (ValueError
        for a parameter array made read-only since: checked before any group is updated)."""
        self._check_writeable()
        dt = self.params[0].dtype if self.params else np.dtype(np.float32)
        cat = [np.ravel(a) for a in self.params]
        return np.concatenate(cat or [np.zeros(0, dt)]), np.concatenate(
            [np.ravel(g) for g in self.grads] or [np.zeros(0, dt)]
        )

    def arrays(self) -> list[np.ndarray]:
        """The parameter arrays (``add_param_group`` refuses one already in a group)."""
        return list(self.params)

    def scatter(self, params: np.ndarray) -> None:
        """Copy the flat ``params`` back into the arrays, in order."""
        off = 0
        for p in self.params:
            p[...] = params[off : off + p.size].reshape(p.shape)
            off += p.size


def _arrays(src: Any) -> list[np.ndarray]:
    """The NumPy arrays a source updates, where it tells (an ``arrays()`` method)."""
    fn = getattr(src, "arrays", None)
    return [a for a in fn() if isinstance(a, np.ndarray)] if callable(fn) else []


class _Group:
    """An extra parameter group: its source, hyper-parameters and (lazily) its own optimizer
    of the owner's class over a flat copy of the parameters."""

    def __init__(self, source: Any, hparams: dict[str, Any]) -> None:
        self.source = source
        self.group: dict[str, Any] = {"params": source, **hparams}  # the live param_groups dict
        self.inner: Any = None

    @property
    def hparams(self) -> dict[str, Any]:
        return {k: v for k, v in self.group.items() if k != "params"}

    @hparams.setter
    def hparams(self, hp: dict[str, Any]) -> None:
        self.group.clear()
        self.group.update({"params": self.source, **hp})

    def prepare(self, owner: Any) -> tuple[Any, np.ndarray, np.ndarray]:
        """``(inner optimizer, params, grads)`` for this step (validated, nothing changed)."""
        p, g = self.source.gather()
        p, g = np.asarray(p), np.asarray(g)
        if p.ndim != 1 or p.shape != g.shape or p.dtype != g.dtype or p.dtype not in _DTYPES:
            raise ValueError(
                f"a parameter group's source gave params {p.dtype}{p.shape} and grads "
                f"{g.dtype}{g.shape}: they must be flat float arrays of one size and dtype"
            )
        owner._validate(**self.hparams)  # param_groups[i] may have been edited since
        inner = self.inner
        if inner is not None and inner.params.shape != p.shape:
            raise ValueError(
                f"a parameter group changed size ({inner.params.shape[0]} -> {p.size}) since "
                "its first step: add groups after calibration (the quantizers' shapes are set)"
            )
        if inner is None:
            inner = type(owner)(np.zeros_like(p), **self.hparams)
        return inner, p, np.ascontiguousarray(g)

    def step(self, inner: Any, p: np.ndarray, g: np.ndarray, grad_scale: float) -> None:
        self.inner = inner
        for k, v in self.hparams.items():  # the group's current hyper-parameters
            setattr(inner, k, v)
        inner.params[...] = p
        inner.step(g, grad_scale=grad_scale)
        self.source.scatter(inner.params)


class _MainGroup(dict):
    """Group 0's ``param_groups`` dict: setting a hyper-parameter sets the optimizer's
    attribute (a plain copy dropped ``opt.param_groups[0]["lr"] = ...`` silently)."""

    def __init__(self, owner: Any, items: dict[str, Any]) -> None:
        super().__init__(items)
        self._owner = owner

    def __setitem__(self, key: str, value: Any) -> None:
        if key not in self._owner._hparam_names:
            raise KeyError(
                f"param_groups[0][{key!r}] cannot be set: group 0's entries are the flat buffer "
                f"and the hyper-parameters {list(self._owner._hparam_names)}"
            )
        setattr(self._owner, key, value)
        super().__setitem__(key, value)

    def update(self, *args: Any, **kw: Any) -> None:  # type: ignore[override]
        for k, v in dict(*args, **kw).items():
            self[k] = v


class ParamGroups:
    """The parameter-group half of nbqat's optimizers (mixed into ``nbqat.optim._Optimizer``)."""

    params: Any
    defaults: dict[str, Any]  # the constructor's hyper-parameters (torch's ``defaults``)
    _hparam_names: tuple[str, ...]
    _groups: list[_Group]

    def _validate(self, **hp: Any) -> None:  # pragma: no cover - the optimizer's
        raise NotImplementedError

    # -- parameter groups ------------------------------------------------------------------
    def hparams(self) -> dict[str, Any]:
        """The hyper-parameters of group 0 (the constructor's keyword arguments)."""
        return {k: getattr(self, k) for k in self._hparam_names}

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        """``[{"params": flat buffer, **hparams}, {"params": source, **hparams}, ...]``.

        The dicts are live, as torch's: ``for g in opt.param_groups: g["lr"] = 1e-4`` takes
        effect at the next step (checked then); group 0's hyper-parameters are the optimizer's
        attributes (``opt.lr``), which its dict reads and writes."""
        main = _MainGroup(self, {"params": self.params, **self.hparams()})
        return [main] + [g.group for g in self._groups]

    def add_param_group(self, group: dict[str, Any]) -> None:
        """Add a parameter group (torch's ``add_param_group``).

        Parameters
        ----------
        group : dict
            ``{"params": ParamSource, <hyper-parameter overrides>}``; the others default to
            the optimizer's constructor arguments (``defaults``, as torch: a later
            ``opt.lr = ...`` of group 0 does not change them), e.g.
            ``{"params": qat.quantizer_parameters(), "lr": 1e-4}``.

        Raises
        ------
        TypeError
            ``group`` is not a dict, or its ``"params"`` has no ``gather`` / ``scatter``.
        ValueError
            An unknown or invalid hyper-parameter, or a source already in a group.
        """
        if not isinstance(group, dict) or "params" not in group:
            raise TypeError("add_param_group: group must be a dict with a 'params' entry")
        src = group["params"]
        if not (callable(getattr(src, "gather", None)) and callable(getattr(src, "scatter", None))):
            raise TypeError(
                "add_param_group: 'params' must be a ParamSource (gather/scatter), e.g. "
                f"nbqat.optim.ArrayGroup(params, grads), got {type(src).__name__}"
            )
        if any(g.source is src for g in self._groups):
            raise ValueError("add_param_group: these parameters are in a group already")
        self._check_disjoint(src)
        extra = sorted(set(group) - {"params", *self._hparam_names})
        if extra:
            raise ValueError(
                f"add_param_group: unknown hyper-parameters {extra} for {type(self).__name__} "
                f"(it has {list(self._hparam_names)})"
            )
        base = getattr(self, "defaults", None) or self.hparams()  # the constructor's, as torch
        hp = {**base, **{k: v for k, v in group.items() if k != "params"}}
        self._validate(**hp)
        self._groups.append(_Group(src, hp))

    def _check_disjoint(self, src: Any) -> None:
        """ValueError if an array of ``src`` shares memory with group 0's buffer or another
        group's arrays (torch: "some parameters appear in more than one parameter group");
        such a parameter would be updated twice per step."""
        new = _arrays(src)
        if not new:
            return
        taken = [("the flat buffer (group 0)", self.params)]
        taken += [(f"param_groups[{i}]", a) for i, g in enumerate(self._groups, 1)
                  for a in _arrays(g.source)]  # fmt: skip
        for j, a in enumerate(new):
            for where, b in taken:
                if isinstance(b, np.ndarray) and np.shares_memory(a, b):
                    raise ValueError(
                        "add_param_group: some parameters appear in more than one parameter "
                        f"group (array {j} of this group shares memory with {where}); each "
                        "parameter may be in one group only"
                    )

    def has_param_group(self, source: Any) -> bool:
        """Whether ``source`` is the ``"params"`` of one of this optimizer's groups.

        Parameters
        ----------
        source : ParamSource

        Returns
        -------
        bool
        """
        return any(g.source is source for g in self._groups)

    def _step_groups(self, grad_scale: float) -> Any:
        """Validate every extra group now; returns the callable that updates them."""
        for i, grp in enumerate(self._groups, 1):  # a key set since (e.g. a torch scheduler's
            extra = sorted(set(grp.hparams) - set(self._hparam_names))  # "initial_lr")
            if extra:
                raise ValueError(
                    f"param_groups[{i}] has unknown hyper-parameters {extra} for "
                    f"{type(self).__name__} (it has {list(self._hparam_names)}): delete them"
                )
        ready = [(grp, *grp.prepare(self)) for grp in self._groups]

        def run() -> None:
            for grp, inner, p, g in ready:
                grp.step(inner, p, g, grad_scale)

        return run

    def _checked_groups(self, saved: Any) -> list[tuple[dict, Any]]:
        """The extra groups' ``(hparams, inner optimizer or None)`` of a saved state, validated
        against this optimizer's groups (nothing changed); no saved groups: fresh states."""
        if saved is None:
            return [(g.hparams, None) for g in self._groups]
        if not isinstance(saved, list | tuple) or len(saved) != len(self._groups):
            n = len(saved) if isinstance(saved, list | tuple) else "?"
            raise ValueError(
                f"state_dict holds {n} extra parameter group(s), this optimizer has "
                f"{len(self._groups)}: add the same groups (add_param_group) before loading"
            )
        out = []
        for i, (grp, st) in enumerate(zip(self._groups, saved)):
            try:
                ghp = dict(st["hparams"])
                self._validate(**ghp)
                inner = None
                if st["state"] is not None:
                    p, _ = grp.source.gather()
                    cls: Any = type(self)  # the optimizer class this mixin is part of
                    inner = cls(np.array(p, copy=True), **ghp)
                    inner.load_state_dict(st["state"])
            except (KeyError, TypeError, ValueError) as e:
                raise ValueError(f"state_dict param_groups[{i}] does not fit: {e}") from e
            out.append((ghp, inner))
        return out
