"""The python code blocks of docs/qat-own-model.md run, in order, in one namespace."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

DOC = Path(__file__).parent.parent / "docs" / "qat-own-model.md"


def test_qat_own_model_page_runs(capsys):
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.S)
    assert len(blocks) == 5
    ns: dict = {}
    for code in blocks:
        exec(compile(code, str(DOC), "exec"), ns)  # noqa: S102
    out = capsys.readouterr().out
    assert "register_qat_module(Scaled" in out
    assert "['encoder', 'fc']" in out  # the head stays float (QATConfig.quantize_output_head)
    assert "\nTrue\n" in out  # onnxruntime agrees with the converted LSTM forecaster
    assert "2 True" in out  # the LSQ scales: a second parameter group, moved by one step
    assert "int4 True" in out  # the grouped int4 engine agrees with its fake-quant model
    assert ns["int8_mse"] == pytest.approx(ns["float_mse"], rel=0.5)
