"""Where :mod:`heldout` reads its files: an installed package, or its wheel in a folder."""

from __future__ import annotations

import importlib.util
import zipfile
from pathlib import Path


def package_bytes(dist: str, member: str, wheels: Path | None = None) -> bytes:
    """The bytes of ``member`` (a path inside a wheel, e.g. ``pvlib/data/12839.tm2``).

    With ``wheels``, the first ``<dist>-*.whl`` there that holds it is opened as a zip;
    otherwise (or when none does) the file is read from the installed package, located by
    ``importlib.util.find_spec`` (which does not import it).

    Raises
    ------
    FileNotFoundError
        Naming the ``pip`` command that brings the file, when neither place has it.
    """
    top, _, rel = member.partition("/")
    if wheels is not None:
        for whl in sorted(Path(wheels).glob(f"{dist.replace('-', '_')}-*.whl")):
            with zipfile.ZipFile(whl) as z:
                if member in z.namelist():
                    return z.read(member)
    spec = importlib.util.find_spec(top)
    if spec is not None and spec.submodule_search_locations:
        path = Path(next(iter(spec.submodule_search_locations))) / rel
        if path.is_file():
            return path.read_bytes()
    where = f"{dist} is not installed" + (
        f" and no {dist}-*.whl in {wheels} holds it" if wheels else ""
    )
    raise FileNotFoundError(
        f"{member}: {where}; run `pip download --no-deps -d WHEELS {dist}` and pass "
        "--wheels WHEELS (or `pip install` it)"
    )
