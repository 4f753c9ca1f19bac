"""The import paths of modules that moved into subpackages, kept working for one release.

``import nbqat.fake_quant`` (or ``from nbqat import fake_quant``) still gives the module, now
:mod:`nbqat.quantization.fake_quant`, with a :class:`DeprecationWarning` naming the new path. The
alias is the moved module object itself (``sys.modules`` holds it under both names), so state,
classes and ``isinstance`` checks are shared. :data:`MOVED` is the one table of old -> new paths.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import warnings
from types import FrameType, ModuleType

_Q = [
    "_blocks",
    "_exact_values",
    "_fake_quant_core",
    "_fake_quantize_fused",
    "_minmax_math",
    "_observer_args",
    "_observer_stats",
    "_quantizer_base",
    "_validate_qparams",
    "_validate_state",
    "affine",
    "fake_quant",
    "fake_quantize",
    "float8",
    "histogram_observers",
    "learnable_fake_quantize",
    "lowbit_quantize",
    "observers",
    "qconfig",
    "range_observers",
]
_T = ["baselines", "plots", "predict", "preflight", "recipe", "report"]

#: Old module path -> new module path (nbqat 0.1 moved these; the old paths go in 0.3).
MOVED: dict[str, str] = {
    **{f"nbqat.{m}": f"nbqat.quantization.{m}" for m in _Q},
    "nbqat.fake_quant_learnable": "nbqat.quantization.lsq",
    **{f"nbqat.{m}": f"nbqat.train.{m}" for m in _T},
    "nbqat.checkpoint": "nbqat.train.checkpoint_schema",
    "nbqat._checkpoint_float": "nbqat.train.checkpoint_float",
    "nbqat._cli_parser": "nbqat.train.parser",
}


def _importer_level() -> int:
    """The ``stacklevel`` of the line that imported the old path, counted from
    :func:`moved_module`: past this module, ``nbqat``'s ``__init__`` and importlib (whose frozen
    frames
    are skipped by :func:`warnings.warn` itself)."""
    frame: FrameType | None = sys._getframe(2)
    level = 2
    here = (__file__, __file__.replace("_moved.py", "__init__.py"), importlib.__file__)
    while frame is not None and (
        frame.f_code.co_filename in here or frame.f_code.co_filename.startswith("<frozen ")
    ):
        level += not frame.f_code.co_filename.startswith("<frozen ")
        frame = frame.f_back
    return level


def moved_module(old: str) -> ModuleType:
    """The module now at ``MOVED[old]``, after a DeprecationWarning naming both paths (and the
    line that used the old one)."""
    new = MOVED[old]
    warnings.warn(
        f"{old} moved to {new}; import it from there (the old path goes in nbqat 0.3)",
        DeprecationWarning,
        stacklevel=_importer_level(),
    )
    return importlib.import_module(new)


class _AliasLoader(importlib.abc.Loader):
    """Loads an old path as the moved module itself (no second module object)."""

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        module = moved_module(spec.name)
        self._spec = module.__spec__
        return module

    def exec_module(self, module: ModuleType) -> None:
        module.__spec__ = self._spec  # importlib set the alias's spec; the module keeps its own


class _AliasFinder(importlib.abc.MetaPathFinder):
    """Finds the old paths of :data:`MOVED` (and nothing else)."""

    def find_spec(self, fullname, path=None, target=None):  # noqa: ANN001 - importlib's API
        if fullname not in MOVED:
            return None
        return importlib.machinery.ModuleSpec(fullname, _AliasLoader())


def install() -> None:
    """Put the finder on ``sys.meta_path`` once (:mod:`nbqat` does, on import)."""
    if not any(isinstance(f, _AliasFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _AliasFinder())
