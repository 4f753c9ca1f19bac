"""Compare two ``nbqat train`` metrics.json files field by field (``environment`` left out;
timings live in timings.json): a change that must not move the default run is checked with

    python benchmarks/compare_metrics.py BEFORE/metrics.json AFTER/metrics.json

Prints every differing path (a value, a type, a missing key, a list length) and exits 1 when
there is any.
"""

from __future__ import annotations

import json
import sys
from typing import Any

SKIP = ("environment",)


def differences(a: Any, b: Any, path: str = "") -> list[tuple[str, str]]:
    """Every path where ``a`` and ``b`` differ (exact equality, types included)."""
    if isinstance(a, dict) and isinstance(b, dict):
        out = []
        for k in sorted(set(a) | set(b)):
            if not path and k in SKIP:
                continue
            if k not in a or k not in b:
                out.append((f"{path}.{k}", "missing in " + ("the first" if k not in a else
                                                             "the second")))  # fmt: skip
            else:
                out += differences(a[k], b[k], f"{path}.{k}")
        return out
    if isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            return [(path, f"length {len(a)} vs {len(b)}")]
        return [d for i, (u, v) in enumerate(zip(a, b)) for d in differences(u, v, f"{path}[{i}]")]
    if type(a) is not type(b) or a != b:
        return [(path, f"{a!r} vs {b!r}")]
    return []


def main(argv: list[str]) -> int:
    a, b = (json.loads(open(p).read()) for p in argv[:2])
    diffs = differences(a, b)
    for p, what in diffs:
        print(p, what)
    print(f"differences: {len(diffs)}")
    return 1 if diffs else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
