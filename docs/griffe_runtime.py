"""Griffe extension for the nbqat site: document what Python sees at run time.

Griffe reads nbqat's source statically, and two things in nbqat exist only at import time:

* the observers' constructor signature: ``_MinMaxBase.__init__(self, *args, **kwargs)`` binds
  against the class attribute ``__signature__``
  (:class:`nbqat.quantization._observer_args.ConstructorSignature`,
  the common arguments written once), so ``inspect.signature(MinMaxObserver)`` is torch's while
  the source shows ``*args, **kwargs``. Griffe compared the documented parameters (``dtype``,
  ``qscheme``, ..., ``nonfinite``) with the static signature and warned for each of them ("does
  not appear in the function signature"), which fails ``mkdocs build --strict``;
* the docstrings completed by :func:`nbqat._docs.fill_doc` (each ``{name}`` line replaced by a
  shared block): the static text holds the bare ``{name}`` line ("Could not parse line").

For every class and function of the ``nbqat`` package that griffe loads, this extension imports
the object and, where the run-time signature or docstring differs from the static one, gives
griffe the run-time one (an own ``__init__`` with :func:`inspect.signature`'s parameters; the
run-time ``__doc__``). The rendered pages then show the signature users call and the docstring
``help()`` shows, and the build does not depend on which griffe version is installed.

Loaded from ``mkdocs.yml`` (``extensions: [docs/griffe_runtime.py:RuntimeSignatures]``; the
path is relative to the folder ``mkdocs`` runs in, the repository root).
"""

from __future__ import annotations

import importlib
import inspect
from typing import Any

from griffe import Docstring, Extension, Function, Parameter, ParameterKind, Parameters

_KIND = {
    inspect.Parameter.POSITIONAL_ONLY: ParameterKind.positional_only,
    inspect.Parameter.POSITIONAL_OR_KEYWORD: ParameterKind.positional_or_keyword,
    inspect.Parameter.VAR_POSITIONAL: ParameterKind.var_positional,
    inspect.Parameter.KEYWORD_ONLY: ParameterKind.keyword_only,
    inspect.Parameter.VAR_KEYWORD: ParameterKind.var_keyword,
}


def _runtime(path: str) -> Any:
    """The object at dotted ``path`` (a module, then attributes), or None."""
    parts = path.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj: Any = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for name in parts[i:]:
            obj = getattr(obj, name, None)
        return obj
    return None


def _annotation(a: Any) -> str | None:
    if a is inspect.Parameter.empty:
        return None
    return a if isinstance(a, str) else inspect.formatannotation(a)


def _parameters(sig: inspect.Signature) -> Parameters:
    params = [Parameter("self", kind=ParameterKind.positional_or_keyword)]
    for p in sig.parameters.values():
        default = None if p.default is inspect.Parameter.empty else repr(p.default)
        annotation = _annotation(p.annotation)
        params.append(Parameter(p.name, annotation=annotation, kind=_KIND[p.kind], default=default))
    return Parameters(*params)


class RuntimeSignatures(Extension):
    """Give griffe nbqat's run-time constructor signatures and filled docstrings."""

    def on_package(self, *, pkg: Any, **kwargs: Any) -> None:
        if pkg.name == "nbqat":
            self._walk(pkg, set())

    def _walk(self, obj: Any, seen: set[str]) -> None:
        for member in list(obj.members.values()):
            if member.is_alias or member.path in seen or not member.path.startswith("nbqat"):
                continue
            seen.add(member.path)
            if member.is_class or member.is_function:
                self._fix(member)
            if member.is_module or member.is_class:
                self._walk(member, seen)

    def _fix(self, obj: Any) -> None:
        rt = _runtime(obj.path)
        if rt is None:
            return
        doc = inspect.cleandoc(rt.__doc__) if isinstance(rt.__doc__, str) else None
        if doc and obj.docstring is not None and obj.docstring.value != doc:
            obj.docstring = Docstring(
                doc, lineno=obj.docstring.lineno, endlineno=obj.docstring.endlineno, parent=obj
            )
        if obj.is_class and "__signature__" in {k for c in rt.__mro__ for k in vars(c)}:
            init = Function(
                "__init__",
                lineno=obj.lineno,
                endlineno=obj.lineno,
                parameters=_parameters(inspect.signature(rt)),
                parent=obj,
            )
            obj.set_member("__init__", init)
