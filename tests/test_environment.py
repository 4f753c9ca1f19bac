"""metrics.json's ``environment`` block: the versions and the BLAS core type the figures rest on."""

from __future__ import annotations

import json
import os
import subprocess
import sys

_PROBE = """
import json, numba, numpy, onnxruntime
from nbqat.train.evaluate import environment
print(json.dumps({"env": environment(), "numpy": numpy.__version__, "numba": numba.__version__,
                  "onnxruntime": onnxruntime.__version__}))
"""


def test_environment_names_the_versions_and_the_blas_core_in_use():
    # a fresh process: OpenBLAS reads OPENBLAS_CORETYPE once, when numpy loads it; Sandybridge
    # (AVX) runs on any x86-64 CPU this project targets and is nobody's default here
    core = "Sandybridge"
    env = {**os.environ, "OPENBLAS_CORETYPE": core}
    r = subprocess.run(
        [sys.executable, "-c", _PROBE], env=env, capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 0, r.stderr[-2000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    e = out["env"]
    # the modules' own version strings (not the distribution metadata environment() reads)
    assert (e["numpy"], e["numba"], e["onnxruntime"]) == (
        out["numpy"],
        out["numba"],
        out["onnxruntime"],
    )
    assert e["python"] == ".".join(map(str, sys.version_info[:3]))
    assert e["OPENBLAS_CORETYPE"] == core
    openblas = [b for b in e["blas"] if b["internal_api"] == "openblas"]
    if not openblas:  # numpy built against another BLAS: the record says which one
        assert e["blas"] and all(b["version"] for b in e["blas"])
        return
    assert [b["architecture"] for b in openblas] == [core]
    assert json.loads(json.dumps(e)) == e  # strict JSON, as metrics.json
