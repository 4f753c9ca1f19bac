"""Issue 28, "one path for each thing": structural checks that fail when a second path returns.

* one module (``nbqat/npz_state.py``) writes and reads ``.npz`` files;
* no module writes another object's underscore attributes on the fake-quantize path;
* the checkpoint codec (``nbqat/npz_state.py``) knows no schema; the job's schema
  (``nbqat.train.checkpoint_schema``) imports nothing else of the job, and no module below
  the job imports it;
* an option that the chosen ``--model`` does not read is a one-line error naming both.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from nbqat.cli import main

PKG = Path(__file__).resolve().parents[1] / "nbqat"


def _modules() -> list[tuple[str, ast.Module]]:
    return [
        (str(p.relative_to(PKG.parent)), ast.parse(p.read_text(encoding="utf-8")))
        for p in sorted(PKG.rglob("*.py"))
    ]


def _calls(tree: ast.AST, names: set[str]) -> list[int]:
    """Lines of calls ``np.<name>(...)`` / ``numpy.<name>(...)`` for a name in ``names``."""
    return [
        n.lineno
        for n in ast.walk(tree)
        if isinstance(n, ast.Call)
        and isinstance(n.func, ast.Attribute)
        and n.func.attr in names
        and isinstance(n.func.value, ast.Name)
        and n.func.value.id in ("np", "numpy")
    ]


def test_one_module_writes_and_reads_npz_files():
    names = {"savez", "savez_compressed", "load", "save"}
    found = {f: _calls(t, names) for f, t in _modules() if f != "nbqat/npz_state.py"}
    assert {f: v for f, v in found.items() if v} == {}
    npz = dict(_modules())["nbqat/npz_state.py"]
    assert _calls(npz, {"savez"}) and _calls(npz, {"load"})  # the check can see a call


def _foreign_private_writes(tree: ast.AST) -> list[str]:
    """``obj._x = ...`` (or ``+=``) where ``obj`` is not ``self`` / ``cls``."""
    out = []
    for n in ast.walk(tree):
        targets = n.targets if isinstance(n, ast.Assign) else [getattr(n, "target", None)]
        if not isinstance(n, ast.Assign | ast.AugAssign | ast.AnnAssign):
            continue
        for t in targets:
            if (
                isinstance(t, ast.Attribute)
                and t.attr.startswith("_")
                and not t.attr.startswith("__")
                and not (isinstance(t.value, ast.Name) and t.value.id in ("self", "cls"))
            ):
                out.append(f"{n.lineno}: {ast.unparse(t)}")
    return out


FAKE_QUANT_PATH = [
    "nbqat/quantization/fake_quantize.py",
    "nbqat/quantization/_fake_quantize_fused.py",
    "nbqat/quantization/_quantizer_base.py",
    "nbqat/quantization/learnable_fake_quantize.py",
    "nbqat/quantization/fake_quant.py",
    "nbqat/train/report.py",
]


@pytest.mark.parametrize("module", FAKE_QUANT_PATH)
def test_no_module_writes_another_objects_private_attributes(module):
    assert _foreign_private_writes(dict(_modules())[module]) == []


def test_the_foreign_write_check_can_fail():
    assert _foreign_private_writes(ast.parse("fq._ran = True\nself._ok = 1")) == ["1: fq._ran"]


def _imported(tree: ast.AST) -> set[str]:
    out: set[str] = set()
    for n in ast.walk(tree):
        if isinstance(n, ast.Import):
            out |= {a.name for a in n.names}
        elif isinstance(n, ast.ImportFrom) and n.module:
            out.add(n.module)
            out |= {f"{n.module}.{a.name}" for a in n.names}
    return out


_SCHEMA = {"nbqat.train.checkpoint_schema", "nbqat.train.checkpoint_float"}


@pytest.mark.parametrize(
    "module, allowed",
    [
        ("nbqat/npz_state.py", set()),  # the codec knows no schema
        ("nbqat/train/checkpoint_schema.py", _SCHEMA),  # the schema: nothing else of the job
        ("nbqat/train/checkpoint_float.py", _SCHEMA),
    ],
)
def test_the_checkpoint_modules_import_nothing_of_the_job(module, allowed):
    imported = _imported(dict(_modules())[module])  # module level and inside functions
    job = {m for m in imported if m == "nbqat.train" or m.startswith("nbqat.train.")}
    assert {m for m in job if m not in allowed and m.rpartition(".")[0] not in allowed} == set()


def test_no_module_below_the_job_imports_it():
    """The data flows one way (docs/architecture.md): only the command line, the Forecaster API
    and the job itself import :mod:`nbqat.train`."""
    above = {"nbqat/cli.py", "nbqat/forecaster.py", "nbqat/__main__.py"}
    bad = {
        path: sorted(m for m in _imported(tree) if m.startswith("nbqat.train"))
        for path, tree in _modules()
        if path not in above and not path.startswith("nbqat/train/")
    }
    assert {p: ms for p, ms in bad.items() if ms} == {}


@pytest.mark.parametrize(
    "extra, opt",
    [
        (["--heads", "2"], "--heads"),
        (["--dropout", "0.2"], "--dropout"),
        (["--no-linear-skip"], "--linear-skip"),
        (["--linear-skip"], "--linear-skip"),
    ],
)
def test_an_option_the_model_does_not_read_is_a_one_line_error(tmp_path, capsys, extra, opt):
    out = tmp_path / "o"
    assert main(["train", "--model", "lstm", *extra, "--out", str(out), "--check"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and opt in err[0] and "--model lstm" in err[0], err
    assert not out.exists()


def test_the_api_refuses_a_tft_option_with_the_lstm_too(tmp_path):
    from nbqat.train import TrainConfig, run

    with pytest.raises(ValueError, match="--heads is not used by --model lstm"):
        run(TrainConfig(model="lstm", heads=2, out=str(tmp_path / "o"), quick=True))
    assert not (tmp_path / "o").exists()


def test_the_fused_helpers_write_no_attribute():
    """FakeQuantize owns its fast path: the compiled helpers return the new state."""
    tree = dict(_modules())["nbqat/quantization/_fake_quantize_fused.py"]
    writes = [
        ast.unparse(t)
        for n in ast.walk(tree)
        if isinstance(n, ast.Assign | ast.AugAssign)
        for t in (n.targets if isinstance(n, ast.Assign) else [n.target])
        if isinstance(t, ast.Attribute)
    ]
    assert writes == []
