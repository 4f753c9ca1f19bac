"""The documentation's code and claims, run: the python code blocks of docs/qat-own-model.md,
in order, in one namespace, and the claims of the other pages that a test can pin."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest
from ref_nn import SMALL_TFT, forecast_batch

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
    assert "IncompatibleKeys(missing_keys=[], unexpected_keys=[])" in out  # state_dict
    assert "\nTrue\n" in out  # onnxruntime agrees with the converted LSTM forecaster
    assert "2 True" in out  # the LSQ scales: a second parameter group, moved by one step
    assert "int4 True" in out  # the grouped int4 engine agrees with its fake-quant model
    assert ns["int8_mse"] == pytest.approx(ns["float_mse"], rel=0.5)


def test_readme_states_what_becomes_an_observed_input():
    """README said 'every other numeric column is an observed input', as if a text column
    were skipped; it is an input too, refused naming --observed-cols, which leaves it out."""
    import pandas as pd

    from nbqat.data import DataError, from_dataframe

    text = " ".join((DOCS.parent / "README.md").read_text().split())
    assert "every other column is an observed, past-only input and must hold numbers" in text
    df = pd.DataFrame({"t": range(40), "y": [float(i % 5) for i in range(40)], "x": 1.0,
                       "note": "n"})  # fmt: skip
    with pytest.raises(DataError, match=r"column 'note' has a non-numeric .*--observed-cols"):
        from_dataframe(df, time_col="t", target_col="y")
    ok = from_dataframe(df, time_col="t", target_col="y", observed_cols=["x"])
    assert ok.observed_names == ["x"]


def test_tft_page_states_the_linear_skips_defaults():
    """docs/tft.md: the skip's learning rate relative to the body's is --skip-lr-scale's default,
    and QAT keeps the skip in float unless QATConfig.quantize_linear_skip."""
    from nbqat.nn import TemporalFusionTransformer
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
    cfg = dataclasses.replace(SMALL_TFT, linear_skip=True)
    qat = QATTemporalFusionTransformer.from_float(TemporalFusionTransformer(cfg, seed=0))
    assert "linear_skip" in qat.float_fallback
    assert not [k for k in qat.fake_quants if k.startswith("linear_skip.")]


def test_int4_rule_keeps_the_documented_layers_at_8_bits(tmp_path):
    """docs/qat-own-model.md: with --group-size 16 on the shipped data's shapes the rule's only
    8-bit layer is the attention's output projection (the linear skip stays float). The model,
    its sizes and its qconfig are the main job's (``nbqat train --weight-bits 4 --group-size
    16`` on the shipped data), not a copy of them."""
    from nbqat.nn.forecasters import build_forecaster, prepare_forecaster
    from nbqat.quantization.lowbit_quantize import GroupFakeQuantize
    from nbqat.quantization.qconfig import QATConfig
    from nbqat.train import TrainConfig, load_data

    text = " ".join(DOC.read_text().split())
    assert (
        "On the shipped data with `--group-size 16` this is the attention's output projection"
        in text
    )
    cfg = TrainConfig(out=str(tmp_path), weight_bits=4, group_size=16).resolved()
    windows = load_data(cfg)
    model = build_forecaster("tft", cfg, windows)
    qat = prepare_forecaster(model, QATConfig(qconfig=cfg.qconfig()))
    qat(*windows.train.batch(slice(0, 2))[:3])
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


def _blocks(path: Path) -> list[str]:
    return re.findall(r"```python\n(.*?)```", path.read_text(), flags=re.S)


def test_getting_started_page_runs_and_prints_what_it_says(capsys):
    blocks = _blocks(DOCS / "getting-started.md")
    assert len(blocks) == 3
    ns: dict = {}
    for code in blocks:
        exec(compile(code, "docs/getting-started.md", "exec"), ns)  # noqa: S102
    scale, zero_point, err = capsys.readouterr().out.split()
    text = " ".join((DOCS / "getting-started.md").read_text().split())
    claim = re.search(r"scale of about ([\d.]+), the zero point (\d+) and a largest error of "
                      r"about ([\d.]+)", text)  # fmt: skip
    assert claim, "docs/getting-started.md no longer states the printed values"
    assert float(scale) == pytest.approx(float(claim[1]), abs=1e-5)
    assert int(zero_point) == int(claim[2])
    assert float(err) == pytest.approx(float(claim[3]), abs=1e-5)
    assert float(err) <= float(scale) / 2  # "half a quantization step"


def test_readme_examples_run(tmp_path, monkeypatch):
    """README's python blocks: the first example, the forecaster and the Forecaster API (on the
    synthetic demand table of tests/test_forecaster.py, written as demand.csv)."""
    import numpy as np
    from test_forecaster import _demand

    blocks = _blocks(DOCS.parent / "README.md")
    assert len(blocks) == 3
    monkeypatch.chdir(tmp_path)
    full = _demand(days=30)  # 2024-03-01 .. 2024-03-30: README's at= is inside
    last = full.groupby("site").cumcount(ascending=False) < 24
    full[~last].to_csv("demand.csv", index=False)
    future = full.copy()
    future.loc[last, ["demand", "temp"]] = np.nan  # the next 24 rows: demand and temp empty
    ns: dict = {"df_with_future_rows": future}
    for code in blocks:
        exec(compile(code, "README.md", "exec"), ns)  # noqa: S102
    assert ns["qat"].model is not ns["model"]
    assert set(ns["future"].columns) == {"entity", "time", "step", "p10", "p50", "p90"}
    assert len(ns["future"]) == 3 * 24 and "actual" in ns["past"].columns
    assert set(ns["bt"].attrs["q_risk"]) == {"P10", "P50", "P90"}
    assert (tmp_path / "demand.onnx").is_file() and (
        tmp_path / "demand-run" / "metrics.json"
    ).is_file()


def test_fragments_of_concepts_distributed_and_export_run(tmp_path, monkeypatch):
    """The code fragments of docs/concepts.md, docs/distributed.md and docs/export.md, given the
    model and batches they assume (a small QAT TFT); concepts' fused clip gives
    clip_grad_norm_'s bits."""
    import numpy as np

    import nbqat
    from nbqat.nn import TemporalFusionTransformer
    from nbqat.nn.qat import QATTemporalFusionTransformer

    rng = np.random.default_rng(0)
    batches = [forecast_batch(rng, SMALL_TFT, 8) for _ in range(3)]

    def qat_model():
        return QATTemporalFusionTransformer.from_float(TemporalFusionTransformer(SMALL_TFT, seed=0))

    (dist_code,) = _blocks(DOCS / "distributed.md")
    ns: dict = {"qat": qat_model(), "batches": batches, "nbqat": nbqat}
    exec(compile(dist_code, "docs/distributed.md", "exec"), ns)  # noqa: S102
    assert np.isfinite(ns["loss"]) and np.isfinite(ns["norm"])

    (concepts_code,) = _blocks(DOCS / "concepts.md")
    a, b = ns["qat"], qat_model()
    b.params[:] = a.params
    b.grads[:] = a.grads
    exec(compile(concepts_code, "docs/concepts.md", "exec"), {"model": a, "nbqat": nbqat})  # noqa: S102
    nbqat.clip_grad_norm_(b.grads, 1.0)
    nbqat.AdamW(b.params, lr=1e-3).step(b.grads)
    np.testing.assert_array_equal(a.params, b.params)  # "gives the same bits"

    export_code = _blocks(DOCS / "export.md")[0]
    monkeypatch.chdir(tmp_path)
    static, historical, future = batches[0][:3]
    ns = {"qat": qat_model(), "batches": batches, "static": static, "historical": historical,
          "future": future}  # fmt: skip
    exec(compile(export_code, "docs/export.md", "exec"), ns)  # noqa: S102
    assert (tmp_path / "model.onnx").is_file() and "pairs" in ns["report"]


def test_api_index_links_every_api_page():
    text = (DOCS / "api" / "index.md").read_text()
    pages = sorted(p.name for p in (DOCS / "api").glob("*.md") if p.name != "index.md")
    assert [p for p in pages if f"]({p})" not in text] == []


def test_home_page_links_every_page():
    text = (DOCS / "index.md").read_text()
    pages = sorted(p.name for p in DOCS.glob("*.md") if p.name != "index.md")
    assert [p for p in pages if f"]({p})" not in text] == []


def test_from_pytorch_page_runs_and_its_float_loop_is_torchs(torch, capsys):
    """docs/from-pytorch.md: the page's script runs (QAT, convert), and its float loop is the
    PyTorch loop of the page's table: torch's Sequential, Adam, ``mse_loss(...).backward()`` and
    ``clip_grad_norm_`` from the same initial weights end at the same weights and norm."""
    import numpy as np

    (code,) = _blocks(DOCS / "from-pytorch.md")
    ns: dict = {}
    exec(compile(code, "docs/from-pytorch.md", "exec"), ns)  # noqa: S102
    out = capsys.readouterr().out
    assert "'0.input_fake_quant', '0.weight_fake_quant'" in out
    fq_line, ort_line = out.strip().splitlines()[-2:]
    assert float(fq_line.rsplit(":", 1)[1]) < 1e-3  # int8 within an output step of fake quant
    assert float(ort_line.rsplit(":", 1)[1]) < 1e-5  # onnxruntime runs the int8 model

    nn = torch.nn
    model = nn.Sequential(nn.Linear(6, 16), nn.ELU(), nn.Linear(16, 3))
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(torch.from_numpy(ns["start"][name]))
    x, y = torch.from_numpy(ns["x"]), torch.from_numpy(ns["y"])
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(20):
        opt.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        norm = nn.utils.clip_grad_norm_(model.parameters(), 0.1)
        opt.step()
    assert ns["norm"] == pytest.approx(float(norm), rel=1e-6)  # the page's figures
    for name, p in model.named_parameters():
        np.testing.assert_allclose(ns["trained"][name], p.detach().numpy(), rtol=0, atol=5e-7)
