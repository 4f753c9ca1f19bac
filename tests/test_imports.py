"""Every nbqat module imports on its own, first (no import cycle that only works in one order).

One interpreter imports each module after removing every nbqat module from ``sys.modules``
except the compiled kernels other than the one under test (``nbqat.kernels.*``: leaf modules
whose decorators make a fresh import cost most of a second; they import only each other and
``nbqat._jit``)."""

from __future__ import annotations

import pkgutil
import subprocess
import sys
from pathlib import Path

import nbqat

_SCRIPT = """
import sys
failed = []
for name in sys.argv[1:]:
    for m in [m for m in sys.modules if m == "nbqat" or m.startswith("nbqat.")]:
        if m.startswith("nbqat.kernels.") and m != name:
            continue
        del sys.modules[m]
    try:
        __import__(name)
    except Exception as e:  # report every module that cannot be imported first
        failed.append(f"{name}: {type(e).__name__}: {e}")
print("\\n".join(failed))
sys.exit(1 if failed else 0)
"""


def test_every_module_imports_first():
    root = Path(nbqat.__file__).parent
    mods = pkgutil.walk_packages([str(root)], prefix="nbqat.")
    names = sorted(m.name for m in mods if not m.name.endswith("__main__"))
    assert "nbqat.nn.int8_tft" in names and len(names) > 50
    r = subprocess.run(
        [sys.executable, "-c", _SCRIPT, *names], capture_output=True, text=True, timeout=600
    )
    assert r.returncode == 0, r.stdout + r.stderr


def test_lazy_re_exports_are_listed_and_resolve():
    # the names nbqat.nn.int8 re-exports (plain imports since issue 28: no PEP 562
    # __getattr__, no import circle) are in dir() and are the objects of their home module.
    import nbqat.nn.int8 as m
    from nbqat.nn import int8_tft

    assert set(m.__all__) <= set(dir(m))
    for name in ("FrozenFakeQuantize", "Int8TemporalFusionTransformer"):
        assert getattr(m, name) is getattr(int8_tft, name)
    assert not hasattr(m, "NoSuchName")
    assert "__getattr__" not in vars(m)
