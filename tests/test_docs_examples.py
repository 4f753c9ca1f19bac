"""The documentation's code and claims, run: the python code blocks of docs/qat-own-model.md,
in order, in one namespace, and the claims of the other pages that a test can pin."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

DOCS = Path(__file__).parent.parent / "docs"
DOC = DOCS / "qat-own-model.md"


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


def test_tft_page_states_the_linear_skips_defaults():
    """docs/tft.md: the skip's learning rate relative to the body's is --skip-lr-scale's default,
    and QAT keeps the skip in float unless QATConfig.quantize_linear_skip."""
    from nbqat.nn import TemporalFusionTransformer, TFTConfig
    from nbqat.nn.qat import QATTemporalFusionTransformer
    from nbqat.train.options import options

    text = " ".join((DOCS / "tft.md").read_text().split())
    m = re.search(
        r"learning rate (\d+) times smaller than the body's \(`--skip-lr-scale` ([\d.]+)", text
    )
    assert m, "docs/tft.md no longer states the skip's learning rate"
    scale = options("train")["skip_lr_scale"].full
    assert float(m[2]) == scale and int(m[1]) == round(1 / scale)
    assert "QAT keeps it in float by default (`QATConfig.quantize_linear_skip=False`" in text
    cfg = TFTConfig(
        num_static_features=2,
        num_known_features=2,
        num_unknown_features=2,
        hidden_dim=4,
        sequence_length=3,
        prediction_horizon=2,
        linear_skip=True,
    )
    qat = QATTemporalFusionTransformer.from_float(TemporalFusionTransformer(cfg, seed=0))
    assert "linear_skip" in qat.float_fallback
    assert not [k for k in qat.fake_quants if k.startswith("linear_skip.")]
