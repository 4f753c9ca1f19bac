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


def test_int4_rule_keeps_the_documented_layers_at_8_bits():
    """docs/qat-own-model.md: with --group-size 16 on the shipped data's shapes the rule's only
    8-bit layer is the attention's output projection (the linear skip stays float)."""
    import numpy as np

    from nbqat.nn import TemporalFusionTransformer, TFTConfig
    from nbqat.nn.qat import QATTemporalFusionTransformer
    from nbqat.quantization.lowbit_quantize import GroupFakeQuantize
    from nbqat.quantization.qconfig import int4_weight_qconfig

    text = " ".join(DOC.read_text().split())
    assert (
        "On the shipped data with `--group-size 16` this is the attention's output projection"
        in text
    )
    cfg = TFTConfig(
        num_static_features=6,
        num_known_features=4,
        num_unknown_features=11,
        hidden_dim=16,
        num_heads=4,
        sequence_length=24,
        prediction_horizon=24,
        linear_skip=True,
    )
    qconfig = int4_weight_qconfig(16, int8_fallback=True)
    qat = QATTemporalFusionTransformer.from_float(TemporalFusionTransformer(cfg, seed=0), qconfig)
    rng = np.random.default_rng(0)
    qat(*(rng.standard_normal(s).astype(np.float32) for s in [(2, 6), (2, 24, 11), (2, 24, 4)]))
    eight_bit = {
        name.rsplit(".", 1)[0]
        for name, fq in qat.fake_quants.items()
        if name.endswith("weight_fake_quant")
        and not (isinstance(fq, GroupFakeQuantize) and fq.per_channel_fallback is False)
    }
    assert eight_bit == {"multihead_attn.out_proj"}


def test_getting_started_states_pyprojects_requirements():
    """docs/getting-started.md: the Python floor, every dependency and the extras' packages are
    pyproject.toml's."""
    import tomllib

    project = tomllib.loads((DOCS.parent / "pyproject.toml").read_text())["project"]
    text = " ".join((DOCS / "getting-started.md").read_text().split())
    floor = project["requires-python"].removeprefix(">=")
    assert f"nbqat needs Python {floor} or newer" in text
    names = {"numpy": "NumPy", "numba": "Numba", "scipy": "SciPy", "threadpoolctl": "threadpoolctl"}
    install = text[text.index("its dependencies are") : text.index("for the versions")]
    for dep in project["dependencies"]:
        name = re.split(r"[<>=\[ ]", dep)[0]
        assert names.get(name, name).lower() in install.lower(), name
    rows = dict(re.findall(r"\| `(\w+)` \| ([^|]+) \|", text))
    for extra in ("cuda", "oracle", "distributed"):
        for dep in project["optional-dependencies"][extra]:
            assert re.split(r"[<>\[ ]", dep)[0].split("==")[0] in rows[extra], (extra, dep)


@pytest.mark.parametrize("package", ["kernels", "quantization", "nn", "train"])
def test_architecture_page_names_every_module(package):
    """docs/architecture.md lists these folders module by module: a new module is named there."""
    text = (DOCS / "architecture.md").read_text()
    folder = DOCS.parent / "nbqat" / package
    modules = sorted(p for p in folder.rglob("*.py") if p.name != "__init__.py")
    assert [str(p.relative_to(folder)) for p in modules if p.stem not in text] == []
