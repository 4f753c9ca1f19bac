"""Every public function and method of ``nbqat`` and ``nbqat.nn`` documents its parameters.

For each object exported by ``nbqat`` and ``nbqat.nn`` (their ``__all__``, or every public name
when a module has no ``__all__``): the numpydoc ``Parameters`` section of each function, of each
class (checked against the constructor's signature) and of each public method defined in nbqat
must list exactly the signature's parameters, in order, ``self``/``cls`` excluded
(``*args``/``**kwargs`` are written with or without their stars). A callable without parameters
needs no section; a callable with parameters needs one.

Objects that are still placeholders (``None``, or defined in a module or function marked
``STUB``) are skipped only while they are stubs, so a real mismatch always fails. The section is
parsed here directly (no numpydoc dependency).
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import re
import sys
from typing import Any

import pytest

PACKAGES = (
    "nbqat",
    "nbqat.nn",
    "nbqat.export",
    "nbqat.data",
    "nbqat.train.checkpoint_schema",
    "nbqat.train.preflight",
    "nbqat.train.plots",
)

_HEADER = re.compile(r"^(?P<title>[A-Za-z][A-Za-z ]*)\n-{3,}[ \t]*$", re.MULTILINE)
_PARAM_SECTIONS = ("Parameters", "Other Parameters")


# --------------------------------------------------------------------------------------------
# numpydoc parsing (just enough for the Parameters section)
# --------------------------------------------------------------------------------------------
def _sections(doc: str) -> dict[str, str]:
    """Split a cleaned docstring into ``{section title: body}`` by numpydoc underlined headers."""
    out: dict[str, str] = {}
    matches = list(_HEADER.finditer(doc))
    for i, m in enumerate(matches):
        end = matches[i + 1].start() if i + 1 < len(matches) else len(doc)
        out[m.group("title").strip()] = doc[m.end() : end]
    return out


def documented_parameters(doc: str | None, section: str = "Parameters") -> list[str] | None:
    """Names listed in a docstring's numpydoc section, in order (``None``: no such section).

    A parameter line starts at the section's indentation; ``x, y : float`` lists two names;
    leading ``*``/``**`` are stripped; description lines (indented further) are ignored.
    """
    if not doc:
        return None
    body = _sections(inspect.cleandoc(doc)).get(section)
    if body is None:
        return None
    lines = [ln for ln in body.splitlines() if ln.strip()]
    if not lines:
        return []
    base = min(len(ln) - len(ln.lstrip()) for ln in lines)
    names: list[str] = []
    for ln in lines:
        if len(ln) - len(ln.lstrip()) != base:
            continue  # a description line
        head = ln.strip().split(" : ", 1)[0].rstrip(":").strip()
        for name in head.split(","):
            name = name.strip().lstrip("*")
            if name:
                names.append(name)
    return names


def signature_parameters(obj: Any) -> list[str] | None:
    """Parameter names of ``obj``'s signature, ``self``/``cls`` excluded (``None``: none found)."""
    try:
        sig = inspect.signature(obj)
    except (TypeError, ValueError):
        return None
    names = [p.name for p in sig.parameters.values()]
    if names and names[0] in ("self", "cls"):
        names = names[1:]
    return names


# --------------------------------------------------------------------------------------------
# collecting the public API
# --------------------------------------------------------------------------------------------
def _is_stub(obj: Any) -> bool:
    """A placeholder that a helper has not written yet."""
    if obj is None:
        return True
    module = sys.modules.get(getattr(obj, "__module__", "") or "")
    mdoc = getattr(module, "__doc__", None) or ""
    if mdoc.lstrip().startswith("STUB"):
        return True
    try:
        src = inspect.getsource(obj)
    except (OSError, TypeError):
        return False
    first = src.split("\n", 1)[0]
    return "# STUB" in first or '"""STUB' in src[:400]


def _from_nbqat(obj: Any) -> bool:
    return (getattr(obj, "__module__", "") or "").split(".")[0] == "nbqat"


def _exported(pkg_name: str) -> list[tuple[str, Any]]:
    pkg = importlib.import_module(pkg_name)
    names = getattr(pkg, "__all__", None)
    if names is None:
        names = [n for n in vars(pkg) if not n.startswith("_")]
    out = []
    for n in names:
        obj = getattr(pkg, n, None)
        if inspect.ismodule(obj):
            continue
        out.append((f"{pkg_name}.{n}", obj))
    return out


def _class_members(cls: type) -> list[tuple[str, Any, Any]]:
    """Public methods (functions, static and class methods) defined in nbqat classes of the MRO,
    as ``(name, callable, identity)``; ``identity`` is the function object that defines it, so a
    method inherited by many classes is checked once."""
    seen: set[str] = set()
    members = []
    for klass in cls.__mro__:
        if not _from_nbqat(klass):
            continue
        for name, raw in vars(klass).items():
            if name.startswith("_") or name in seen:
                continue
            seen.add(name)
            if isinstance(raw, (staticmethod, classmethod)):
                members.append((name, getattr(cls, name), raw.__func__))
            elif inspect.isfunction(raw):
                members.append((name, raw, raw))
    return members


def _constructor_doc_and_params(cls: type) -> tuple[str | None, list[str] | None, str]:
    """Docstring holding the constructor's parameters, and the constructor's parameter names."""
    params = signature_parameters(cls)
    cdoc = cls.__doc__
    sections = ("Parameters", "Attributes") if dataclasses.is_dataclass(cls) else ("Parameters",)
    for sec in sections:
        if documented_parameters(cdoc, sec) is not None:
            return cdoc, params, sec
    init = vars(cls).get("__init__")
    if init is not None and init.__doc__ and documented_parameters(init.__doc__) is not None:
        return init.__doc__, params, "Parameters"
    return cdoc, params, "Parameters"


def _cases() -> list[Any]:
    cases: list[Any] = []
    seen: set[int] = set()
    for pkg in PACKAGES:
        try:
            exported = _exported(pkg)
        except Exception as exc:  # pragma: no cover - an import error is reported as a failure
            cases.append(pytest.param(pkg, None, "import", id=f"{pkg}:import-error:{exc!r}"[:80]))
            continue
        for qualname, obj in exported:
            if id(obj) in seen and obj is not None:
                continue
            seen.add(id(obj))
            if inspect.isclass(obj):
                if _is_stub(obj):
                    cases.append(pytest.param(qualname, None, "stub", id=qualname))
                    continue
                cases.append(pytest.param(qualname, obj, "class", id=qualname))
                for mname, meth, ident in _class_members(obj):
                    if id(ident) in seen:
                        continue  # inherited: already checked where it is defined
                    seen.add(id(ident))
                    owner = ident.__qualname__.rsplit(".", 1)[0]
                    name = f"{ident.__module__}.{owner}.{mname}"
                    cases.append(pytest.param(name, meth, "function", id=name))
            elif inspect.isroutine(obj) or hasattr(obj, "py_func"):  # functions, numba dispatchers
                kind = "stub" if _is_stub(obj) else "function"
                cases.append(pytest.param(qualname, obj, kind, id=qualname))
            elif obj is None:
                cases.append(pytest.param(qualname, None, "stub", id=qualname))
            # other objects (constants, config instances such as default_qat_qconfig) have no
            # signature to check
    return cases


def _check(doc: str | None, params: list[str] | None, section: str) -> str | None:
    """An error message, or None when the docstring's section matches the parameters."""
    if params is None:
        return None  # no introspectable signature (a C builtin): nothing to compare
    documented = documented_parameters(doc, section)
    if documented is None:
        if not params:
            return None
        return f"has parameters {params} but no numpydoc '{section}' section"
    if documented != params:
        return f"numpydoc '{section}' lists {documented}, the signature has {params}"
    return None


# --------------------------------------------------------------------------------------------
# the check itself
# --------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("qualname", "obj", "kind"), _cases())
def test_parameters_section_matches_signature(qualname: str, obj: Any, kind: str) -> None:
    if kind == "import":
        importlib.import_module(qualname)  # re-raise the import error
    if kind == "stub":
        pytest.skip(f"{qualname} is still a STUB")
    if kind == "class":
        doc, params, section = _constructor_doc_and_params(obj)
    else:
        doc, params, section = inspect.getdoc(obj), signature_parameters(obj), "Parameters"
    error = _check(doc, params, section)
    assert error is None, f"{qualname}: {error}"


def test_public_api_is_not_empty() -> None:
    import nbqat

    assert len(nbqat.__all__) > 10


# --------------------------------------------------------------------------------------------
# the checker must catch real mismatches (checked on synthetic functions)
# --------------------------------------------------------------------------------------------
def _good(x, scale, *, out=None, **kwargs):
    """Do something.

    Parameters
    ----------
    x : numpy.ndarray
        Input, shape (n,).
    scale : float
        Scale. A description line that mentions
        y : a colon after a name, indented, so it is not a parameter.
    out : numpy.ndarray, optional
        Output buffer.
    **kwargs
        Passed on.

    Returns
    -------
    numpy.ndarray
        The result.
    """


def _swapped(x, scale):
    """Do something.

    Parameters
    ----------
    scale : float
        Scale.
    x : numpy.ndarray
        Input.
    """


def _missing(x, scale, zero_point):
    """Do something.

    Parameters
    ----------
    x, scale : float
        Inputs.
    """


def _undocumented(x):
    """Do something without saying what x is."""


def _no_params():
    """Nothing to document.

    Returns
    -------
    int
        Zero.
    """


class _Thing:
    """A class with its constructor's parameters in the class docstring.

    Parameters
    ----------
    a : int
        First.
    b : int, default 2
        Second.
    """

    def __init__(self, a, b=2):
        self.a, self.b = a, b

    def method(self, y):
        """A method.

        Parameters
        ----------
        z : float
            Wrong name.
        """


def test_checker_accepts_a_matching_docstring() -> None:
    assert documented_parameters(_good.__doc__) == ["x", "scale", "out", "kwargs"]
    assert _check(inspect.getdoc(_good), signature_parameters(_good), "Parameters") is None
    assert (
        _check(inspect.getdoc(_no_params), signature_parameters(_no_params), "Parameters") is None
    )
    doc, params, section = _constructor_doc_and_params(_Thing)
    assert params == ["a", "b"]
    assert _check(doc, params, section) is None


@pytest.mark.parametrize("fn", [_swapped, _missing, _undocumented, _Thing.method])
def test_checker_rejects_a_mismatch(fn: Any) -> None:
    assert _check(inspect.getdoc(fn), signature_parameters(fn), "Parameters") is not None


def test_checker_sees_other_sections_end_the_parameters() -> None:
    doc = inspect.getdoc(_good)
    assert "Returns" in _sections(doc)
    assert documented_parameters(doc, "Returns") == ["numpy.ndarray"]
