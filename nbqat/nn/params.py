"""Modules and the flat parameter / gradient buffer (the llm.c pattern).

A :class:`Module` declares its parameters (name, shape, initialiser) when it is constructed;
nothing is allocated then. :class:`ParameterBuffer` walks a module tree once, allocates ONE
contiguous 1-D ``params`` array and ONE ``grads`` array of the same size and layout, and binds
each declared parameter to a view: ``layer.weight`` is a view into ``params`` and
``layer.weight_grad`` the view at the same offsets in ``grads``. Backward passes accumulate
(``+=``) into the gradient views; :meth:`ParameterBuffer.zero_grad` clears the whole buffer at
once. An optimizer then updates ``params`` in place from ``grads`` in one flat loop.

Initial values are drawn in float64 from ``numpy.random.default_rng(seed)`` in traversal order
and then cast, so a float32 and a float64 model built with the same seed hold the same weights
(up to float32 rounding).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from nbqat.nn.init import Init
from nbqat.nn.state_dict import IncompatibleKeys, bound_params, load_params


def stacked_view(arrays: Sequence[np.ndarray]) -> np.ndarray | None:
    """The arrays as one ``(len(arrays), *shape)`` view without a copy, when they lie evenly
    spaced in one buffer (the same parameter of the m equal modules of a :class:`ModuleList`
    in a :class:`ParameterBuffer`); None otherwise.

    Parameters
    ----------
    arrays : sequence of ndarray
        At least one; each C-contiguous, of one shape and dtype.

    Returns
    -------
    ndarray or None
        A view into the arrays' common buffer (writable where they are: ``view[j] += g``
        writes ``arrays[j]``), or None when they are not evenly spaced in one buffer.
    """
    a0 = arrays[0]
    base = a0.base if a0.base is not None else a0
    if not a0.flags.c_contiguous:
        return None
    ptrs = [a.__array_interface__["data"][0] for a in arrays]
    step = ptrs[1] - ptrs[0] if len(arrays) > 1 else a0.nbytes
    for j, a in enumerate(arrays):
        if (
            a.shape != a0.shape
            or a.dtype != a0.dtype
            or not a.flags.c_contiguous
            or (a.base if a.base is not None else a) is not base
            or ptrs[j] != ptrs[0] + j * step
        ):
            return None
    if step < a0.nbytes:  # overlapping (or reversed) views
        return None
    return np.lib.stride_tricks.as_strided(
        a0, (len(arrays), *a0.shape), (step, *a0.strides), writeable=a0.flags.writeable
    )


def layer_size(owner: str, name: str, v: Any) -> int:
    """``v`` as a Python int when it is a positive int (NumPy integers too), else a ValueError
    naming ``owner`` and ``name``: ``int()`` would truncate 2.7 to a layer of size 2 and a
    size 0 fail later (a ZeroDivisionError in the initialiser)."""
    if isinstance(v, bool) or not isinstance(v, int | np.integer) or v < 1:
        raise ValueError(f"{owner}: {name} must be a positive int, got {v!r}")
    return int(v)


def read_only_view(a: np.ndarray) -> np.ndarray:
    """A read-only view of ``a`` (``a`` stays writeable), for an array backward reads that a
    layer hands out: a caller's in-place edit raises instead of changing the gradients."""
    v = a.view()
    v.flags.writeable = False
    return v


#: How many times any module tree gained or lost a child (:meth:`Module.modules_of_type`'s key).
_TREE_EDITS = [0]


class Module:
    """Base class of nbqat's layers: declared parameters, child modules, forward/backward.

    Subclasses call :meth:`declare` for each parameter and assign child modules as attributes
    (registered in assignment order, like ``torch.nn.Module``). ``forward`` caches what
    ``backward`` needs on the module itself, so each module is called once per forward pass;
    ``backward`` accumulates into the gradient views and returns the input gradient(s).

    Attributes
    ----------
    FOLDS : tuple of str
        Names of this class's boolean switches for algebraic folds (two affine maps computed as
        one; same function, float rounding in another order), all on by default;
        :meth:`set_folding` sets them for a whole model.
    DRAWS_STREAM : bool
        True on layers that draw random masks (Dropout): :meth:`number_streams` numbers them.
    """

    FOLDS: tuple[str, ...] = ()
    DRAWS_STREAM = False

    def __init__(self) -> None:
        object.__setattr__(self, "_modules", {})
        object.__setattr__(self, "_param_specs", {})
        object.__setattr__(self, "_cache", None)
        object.__setattr__(self, "training", True)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """``module(x)`` is ``module.forward(x)`` (torch's habit)."""
        return self.forward(*args, **kwargs)

    def train(self, mode: bool = True) -> Any:
        """Set training mode (``training = mode``) on this module and every descendant.

        Layers whose behaviour differs between training and evaluation read ``self.training``
        (dropout); a prepared QAT model also stops every observer in eval mode
        (:class:`~nbqat.nn.phases.QATPhases`).

        Parameters
        ----------
        mode : bool, default True
            False is :meth:`eval`.

        Returns
        -------
        Module
            self.
        """
        for mod in self.modules():
            object.__setattr__(mod, "training", bool(mode))
        self.number_streams()
        return self

    def number_streams(self) -> int:
        """Give the mask-drawing layers (``DRAWS_STREAM``: Dropout) of this tree the streams 0,
        1, ... in module order, so that no two of them draw the same mask; done by
        :class:`ParameterBuffer`, :meth:`train` and :func:`~nbqat.nn.set_dropout`.

        Returns
        -------
        int
            The number of such layers.
        """
        layers = [m for m in self.modules() if m.DRAWS_STREAM]
        for i, mod in enumerate(layers):
            mod.stream = i
        return len(layers)

    def eval(self) -> Any:
        """Evaluation mode: :meth:`train` with False. Returns self."""
        return self.train(False)

    if TYPE_CHECKING:  # parameter views are bound at run time (declare + ParameterBuffer)

        def __getattr__(self, name: str) -> Any: ...

    def __setattr__(self, name: str, value: Any) -> None:
        if name == "_cache":  # set by every forward: skip the registry checks
            object.__setattr__(self, name, value)
            return
        specs = self.__dict__.get("_param_specs", {})
        if (
            value is not self.__dict__.get(name, value)
            and (  # `+=` sets the same view
                name in specs or (name.endswith("_grad") and name[:-5] in specs)
            )
        ):
            raise AttributeError(  # a new array: forward reads it, the optimizer the buffer
                f"{type(self).__name__}.{name} is a view into the model's flat buffer: assign "
                f"in place, {name}[...] = value"
            )
        if isinstance(value, Module):
            self._modules[name] = value
            _TREE_EDITS[0] += 1
        elif name in self.__dict__.get("_modules", {}):
            del self._modules[name]
            _TREE_EDITS[0] += 1
        object.__setattr__(self, name, value)

    def declare(self, name: str, shape: tuple[int, ...], init: Init) -> None:
        """Declare parameter ``name`` of ``shape``; bound to views by :class:`ParameterBuffer`.

        Until then ``self.<name>`` and ``self.<name>_grad`` are None. Assigning either
        attribute raises AttributeError (set the values in place, ``layer.weight[...] = w``).

        Parameters
        ----------
        name : str
            Attribute name of the parameter; its gradient view is ``<name>_grad``. Declaring
            the same name again replaces the earlier declaration.
        shape : tuple of int
            Shape of the parameter (``()`` for a scalar).
        init : Init
            ``init(rng, shape) -> ndarray``: the initial values, drawn in float64 from the
            buffer's ``numpy.random.Generator`` and cast to the buffer's dtype.
        """
        self._param_specs[name] = (tuple(int(s) for s in shape), init)
        object.__setattr__(self, name, None)
        object.__setattr__(self, name + "_grad", None)

    def named_modules(self, prefix: str = "") -> Iterator[tuple[str, Module]]:
        """Yield ``(dotted_name, module)`` for this module and every descendant, depth first in
        registration order (``torch.nn.Module.named_modules``).

        Parameters
        ----------
        prefix : str, default ""
            Name given to this module; a child ``c`` is named ``prefix + "." + c`` (just ``c``
            when ``prefix`` is "").

        Yields
        ------
        tuple of (str, Module)
            This module first (named ``prefix``), then its descendants.
        """
        yield prefix, self
        for name, child in self._modules.items():
            yield from child.named_modules(prefix + "." + name if prefix else name)

    def modules(self) -> Iterator[Module]:
        """This module and every descendant, as :meth:`named_modules` without the names
        (``torch.nn.Module.modules``); cheaper where names are not needed (a training step's
        :func:`~nbqat.nn.set_dropout`)."""
        stack = [self]
        while stack:
            mod = stack.pop()
            yield mod
            stack.extend(reversed(mod._modules.values()))

    def modules_of_type(self, cls: type) -> tuple[Any, ...]:
        """The modules of :meth:`modules` that are instances of ``cls``, in that order.

        Kept until any module tree changes (a child module set or removed anywhere), so a
        training step's :func:`~nbqat.nn.set_dropout` does not walk the whole tree again.

        Parameters
        ----------
        cls : type

        Returns
        -------
        tuple of Module
        """
        key = (cls, _TREE_EDITS[0])
        kept = self.__dict__.get("_of_type")
        if kept is None or kept[0] != key:
            kept = (key, tuple(m for m in self.modules() if isinstance(m, cls)))
            object.__setattr__(self, "_of_type", kept)
        return kept[1]

    def set_folding(self, enabled: bool) -> int:
        """Switch every algebraic fold of this module and its descendants on or off.

        Folds apply only where no quantization hook sits between the folded maps, so QAT and
        the int8 model never use them; with folding off, the float model computes exactly what
        a QAT model with fake quantization disabled computes (bit for bit).

        Parameters
        ----------
        enabled : bool
            True (the default state) folds where it is valid; False runs every layer as written.

        Returns
        -------
        int
            How many switches were set (the ``FOLDS`` of all modules).
        """
        n = 0
        for mod in self.modules():
            for name in mod.FOLDS:
                setattr(mod, name, bool(enabled))
                n += 1
        return n

    def children(self) -> Iterator[Module]:
        """The direct child modules."""
        yield from self._modules.values()

    def named_parameters(
        self, prefix: str = "", recurse: bool = True
    ) -> Iterator[tuple[str, np.ndarray]]:
        """Yield ``(dotted_name, view)`` for every parameter (views into the flat buffer).

        Parameters
        ----------
        prefix : str, default ""
            Prepended to every name, as in :meth:`named_modules`.
        recurse : bool, default True
            False: only this module's own parameters (``torch.nn.Module.named_parameters``).

        Yields
        ------
        tuple of (str, numpy.ndarray)
            ``"<module path>.<parameter>"`` and the parameter view (None before a
            :class:`ParameterBuffer` is built), in the buffer's layout order.
        """
        return self._named_views(prefix, "", recurse)

    def named_grads(self, prefix: str = "") -> Iterator[tuple[str, np.ndarray]]:
        """The gradient twin of :meth:`named_parameters`: ``(dotted_name, gradient view)``,
        same names (no ``_grad`` suffix) and order; each view lies in the flat gradient buffer
        with its parameter's shape and dtype.

        Parameters
        ----------
        prefix : str, default ""
            As in :meth:`named_parameters`; yields ``(str, numpy.ndarray)`` pairs.
        """
        return self._named_views(prefix, "_grad")

    def state_dict(self) -> OrderedDict[str, np.ndarray]:
        """Copies of every parameter by dotted name (``torch.nn.Module.state_dict``'s names and
        layouts, e.g. ``"0.weight"`` (out, in)); :meth:`load_state_dict` takes it back."""
        named = bound_params(self.named_parameters(), "state_dict")
        return OrderedDict((k, v.copy()) for k, v in named.items())

    def load_state_dict(self, state_dict: Any, strict: bool = True) -> IncompatibleKeys:
        """Copy a :meth:`state_dict` into the parameter views (the flat buffer is kept), every
        value checked before the first write (torch's copies stop half way).

        Parameters
        ----------
        state_dict : mapping of str to array
            Values (arrays, torch tensors) of the parameters' shapes, cast to their dtype.
        strict : bool, default True
            Refuse missing or unexpected keys; False loads the keys that match.

        Returns
        -------
        IncompatibleKeys
            ``(missing_keys, unexpected_keys)``, both empty under ``strict``.

        Raises
        ------
        CheckpointError
            (a ValueError) missing or unexpected keys under ``strict``; a shape mismatch.
        TypeError
            A non-mapping, or values that are not real numbers. Nothing is written then.
        RuntimeError
            Parameters not bound yet (build a ParameterBuffer first; also for state_dict).
        """
        return load_params(
            bound_params(self.named_parameters(), "load_state_dict"), state_dict, strict
        )

    def _named_views(self, prefix: str, suffix: str, recurse: bool = True) -> Iterator[Any]:
        for mname, mod in self.named_modules(prefix) if recurse else [(prefix, self)]:
            for pname in mod._param_specs:
                yield (mname + "." + pname if mname else pname), getattr(mod, pname + suffix)

    def _require_forward(self) -> Any:
        if self._cache is None:
            raise RuntimeError(
                f"{type(self).__name__}.backward called before forward: run forward first"
            )
        return self._cache

    def _grad_in(self, g: Any, shape: tuple[int, ...], dtype: Any, name: str = "dy") -> Any:
        """``g`` as a C-contiguous ``dtype`` array of exactly ``shape`` (the last forward's
        output, or state), else a ValueError naming the layer: the compiled backward passes
        index by the forward's sizes, so another shape would read or write out of bounds."""
        if np.shape(g) != tuple(shape):
            raise ValueError(
                f"{type(self).__name__}.backward: {name} must have shape {tuple(shape)} (the "
                f"last forward's), got {np.shape(g)}"
            )
        return np.ascontiguousarray(g, dtype=dtype)


class ModuleList(Module):
    """An indexable list of modules registered under the names "0", "1", ... (torch's).

    Parameters
    ----------
    modules : list of Module
        The children, in order; ``module_list[i]`` is ``modules[i]``.
    """

    def __init__(self, modules: list[Module]) -> None:
        super().__init__()
        for i, m in enumerate(modules):
            setattr(self, str(i), m)

    def __getitem__(self, i: int) -> Any:
        return self._modules[str(i)]

    def __len__(self) -> int:
        return len(self._modules)

    def __iter__(self) -> Iterator[Any]:
        return iter(self._modules.values())


def _check_no_reuse(module: Module) -> None:
    """A ValueError when one module object sits at two places of the tree: each module keeps
    one forward cache for its backward and one place in the flat buffers, so a second use
    would overwrite the first's cache (its gradients silently wrong) and get a second copy of
    the parameters that only one use reads."""
    seen: dict[int, str] = {}
    for name, mod in module.named_modules():
        first = seen.setdefault(id(mod), name)
        if first != name:
            raise ValueError(
                f"module {name!r} is the same {type(mod).__name__} object as module "
                f"{first!r}: a module can appear once in a model (it keeps one forward cache "
                "for its backward); build a separate module for each place (nbqat has no "
                "weight sharing)"
            )


class ParameterBuffer:
    """One flat parameter buffer and one flat gradient buffer for a module tree.

    Parameters
    ----------
    module : Module
        Root of the tree; every declared parameter of every descendant gets a view.
    dtype : numpy dtype, default float32
        float32 or float64.
    seed : int, default 0
        Seed of the float64 initialisation stream.

    Attributes
    ----------
    params, grads : numpy.ndarray
        1-D C-contiguous arrays of the same size and layout; ``grads`` starts at zero.
    offsets : dict
        ``dotted_name -> (start, shape)`` of every parameter.

    Raises
    ------
    ValueError
        ``dtype`` neither float32 nor float64; one module object at two places of the tree
        (``Sequential(a, ELU(), a)``: a module keeps one forward cache, so it is used once).
    """

    def __init__(self, module: Module, dtype: Any = np.float32, seed: int = 0) -> None:
        dtype = np.dtype(dtype)
        if dtype not in (np.dtype(np.float32), np.dtype(np.float64)):
            raise ValueError(f"dtype must be float32 or float64, got {dtype}")
        specs = []
        total = 0
        _check_no_reuse(module)
        module.number_streams()
        for mname, mod in module.named_modules():
            for pname, (shape, init) in mod._param_specs.items():
                size = int(np.prod(shape)) if shape else 1
                specs.append((mname, mod, pname, shape, init, total))
                total += size
        self.dtype = dtype
        self.params = np.zeros(total, dtype=dtype)
        self.grads = np.zeros(total, dtype=dtype)
        self.offsets: dict[str, tuple[int, tuple[int, ...]]] = {}
        rng = np.random.default_rng(seed)
        for mname, mod, pname, shape, init, start in specs:
            size = int(np.prod(shape)) if shape else 1
            pview = self.params[start : start + size].reshape(shape)
            gview = self.grads[start : start + size].reshape(shape)
            pview[...] = np.asarray(init(rng, shape), dtype=np.float64).astype(dtype)
            object.__setattr__(mod, pname, pview)
            object.__setattr__(mod, pname + "_grad", gview)
            self.offsets[mname + "." + pname if mname else pname] = (start, shape)

    def zero_grad(self) -> None:
        """Set the whole gradient buffer to zero (one pass)."""
        self.grads.fill(0)


class BufferedModel(Module):
    """A root Module that owns its :class:`ParameterBuffer` (``self.buffer``, set by the
    subclass's constructor): the forecasters. Gives the flat ``params`` / ``grads`` views and
    ``zero_grad`` over them."""

    buffer: ParameterBuffer

    @property
    def params(self) -> np.ndarray:
        """The flat parameter buffer (every parameter is a view into it)."""
        return self.buffer.params

    @property
    def grads(self) -> np.ndarray:
        """The flat gradient buffer (same layout as :attr:`params`)."""
        return self.buffer.grads

    def zero_grad(self) -> None:
        """Clear the whole flat gradient buffer."""
        self.buffer.zero_grad()
