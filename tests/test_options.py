"""The one registry of the main job's options (nbqat.train.options, issue 28).

Argparse, TrainConfig, Forecaster and the checkpoint reader are built from it: each refuses the
same bad value naming the option; the registry, the parser and the docs table list the same
options; an option the chosen model does not read is an error, a default never is.
"""

from __future__ import annotations

import argparse
import typing
from dataclasses import fields
from pathlib import Path

import pytest

from nbqat.cli import main
from nbqat.forecaster import Forecaster
from nbqat.train import TrainConfig
from nbqat.train import checkpoint_schema as ckpt
from nbqat.train.checkpointing import config_schema
from nbqat.train.option_doc import REGENERATE, markdown
from nbqat.train.options import OPTIONS, config_options, options
from nbqat.train.parser import build_parser

ROOT = Path(__file__).resolve().parents[1]

# (option, a bad value, its command-line spelling, words the messages must hold); the oracle
# is each option's documented range, written here independently of the registry.
BAD = [
    ("epochs", 0, "0", "positive integer"),
    ("qat_epochs", -1, "-1", "integer >= 0"),
    ("lr", -1.0, "-1", "positive"),
    ("lr", float("inf"), "inf", "positive finite"),
    ("dropout", 1.0, "1", "[0, 1)"),
    ("ema_decay", -0.5, "-0.5", "[0, 1)"),
    ("plateau_factor", 1.5, "1.5", "[0, 1)"),
    ("max_norm", 0.0, "0", "positive"),
    ("seed", -1, "-1", "integer >= 0"),
    ("group_size", 0, "0", "positive integer"),
    ("horizon", 0, "0", "positive integer"),
    ("observer", "kl", "kl", "'minmax'"),
    ("model", "gru", "gru", "'tft'"),
    ("weight_bits", 6, "6", "8"),
    ("device", "tpu", "tpu", "cpu"),
]


def _subparser(command: str) -> argparse.ArgumentParser:
    p = build_parser()
    sub = next(a for a in p._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices[command]


def _flag(name: str) -> str:
    return options("train")[name].flag


@pytest.mark.parametrize("name, value, text, words", BAD)
def test_argparse_refuses_the_value_naming_the_option(name, value, text, words, capsys):
    with pytest.raises(SystemExit) as ei:
        main(["train", _flag(name), text, "--check"])
    assert ei.value.code == 2
    err = capsys.readouterr().err
    assert f"argument {_flag(name)}" in err
    assert words in err or "invalid choice" in err, err


@pytest.mark.parametrize("name, value, text, words", BAD)
def test_trainconfig_and_forecaster_refuse_the_value_naming_the_option(name, value, text, words):
    kw = {name: value, **({"weight_bits": 4} if name == "group_size" else {})}
    for build in (TrainConfig, Forecaster):
        with pytest.raises(ValueError, match=f"^{_flag(name)} must be") as ei:
            build(**kw)
        assert words in str(ei.value), (build, str(ei.value))


def _write_state(folder, cfg):
    """A float-phase state.json of ``cfg`` (with its checksum) in ``folder``."""
    state = {"phase": "float", "epoch": 0, "batch_pos": 0, "epoch_loss_sum": 0.0,
             "best_val": None, "best_epoch": -1, "bad_epochs": 0, "stopped_early": False,
             "lr_factor": 1.0, "plateau_epoch": -1, "curves": {}, "step_losses": {},
             "grad_norms": {}, "timings": {}}  # fmt: skip
    data = {"path": "/x", "bytes": 1, "sha256": "0"}
    (folder / "state.json").write_text(ckpt.state_json(cfg, state, data))


@pytest.mark.parametrize("name, value, text, words", [b for b in BAD if b[2] != "inf"])
def test_the_checkpoint_refuses_the_value_naming_the_field(name, value, text, words, tmp_path):
    cfg = TrainConfig(quick=True).resolved().to_json()
    cfg.update(history=24, csv=None)  # as load_data leaves it
    cfg[name] = value
    _write_state(tmp_path, cfg)
    with pytest.raises(ckpt.CheckpointError, match=f"field 'config.{name}': expected") as ei:
        ckpt.read_state(tmp_path, config_schema())
    assert words in str(ei.value)


def test_a_resolved_default_config_passes_the_checkpoint_checks():
    cfg = TrainConfig().resolved().to_json()
    cfg.update(history=24)
    schema = config_schema()
    assert set(schema) == set(cfg)
    assert {k: schema[k](v) for k, v in cfg.items() if schema[k](v) is not None} == {}


def _parser_dests(command: str) -> set[str]:
    dests = set()
    for a in _subparser(command)._actions:
        if isinstance(a, argparse._HelpAction):
            continue
        dests.add(a.dest)
    return dests


def _registry_dests(command: str) -> set[str]:
    return {("no_" + o.name) if o.cli == "negated" else o.name for o in options(command).values()}


@pytest.mark.parametrize("command", ["train", "predict", "backtest"])
def test_the_parser_holds_exactly_the_registry(command):
    assert _parser_dests(command) == _registry_dests(command)


@pytest.mark.parametrize("command", ["train", "predict", "backtest"])
def test_the_docs_table_holds_exactly_the_registry(command):
    page = (ROOT / "docs" / "options.md").read_text(encoding="utf-8")
    section = page.split(f"## nbqat {command}\n")[1].split("\n## ")[0]
    rows = [ln for ln in section.splitlines() if ln.startswith("| `")]
    flags = {ln.split("`")[1] for ln in rows}
    assert flags == {o.flag for o in options(command).values()}


def test_the_committed_docs_table_is_the_generated_one():
    page = (ROOT / "docs" / "options.md").read_text(encoding="utf-8")
    assert page == markdown(), f"docs/options.md is stale: regenerate it with `{REGENERATE}`"


def test_mkdocs_lists_the_options_page():
    assert "options.md" in (ROOT / "mkdocs.yml").read_text(encoding="utf-8")


def test_help_shows_the_registry_defaults():
    text = _subparser("train").format_help()
    for o in options("train").values():
        if o.cli != "hidden" and o.default_text() is not None:
            assert f"[default: {o.default_text()}]" in " ".join(text.split()), o.name


def test_trainconfig_fields_are_the_registry_options():
    hints = typing.get_type_hints(TrainConfig)
    reg = config_options()
    assert sorted(f.name for f in fields(TrainConfig)) == sorted(reg)  # field order: to_json's
    for f in fields(TrainConfig):
        o = reg[f.name]
        assert f.default == o.default or (f.default is None and o.default is None), f.name
        assert f.metadata["option"] is o
        assert o.type in typing.get_args(hints[f.name]) or hints[f.name] is o.type, f.name
        if o.nullable or o.default is None:
            assert type(None) in typing.get_args(hints[f.name]), f.name


def test_the_names_are_defined_once():
    from nbqat.nn.forecasters import FORECASTERS
    from nbqat.quantization.qconfig import WEIGHT_BITS, WEIGHT_DTYPES
    from nbqat.train.predict import ENGINES
    from nbqat.train.report import OBSERVERS

    train = options("train")
    assert train["model"].choices is FORECASTERS
    assert train["observer"].choices == (*OBSERVERS, "all")
    assert train["weight_bits"].choices is WEIGHT_BITS
    assert train["weight_dtype"].choices is WEIGHT_DTYPES
    assert options("predict")["engine"].choices is ENGINES
    paths = ("nbqat/train/parser.py", "nbqat/train/config.py", "nbqat/train/checkpoint_schema.py")
    for path in paths:
        src = (ROOT / path).read_text(encoding="utf-8")
        assert '"histogram", "percentile"' not in src and '("tft", "lstm")' not in src, path
        assert '"float8_e4m3fn")' not in src, path


def test_checkpoint_repeats_no_range_rule():
    src = (ROOT / "nbqat" / "train" / "checkpoint_schema.py").read_text(encoding="utf-8")
    # the state's consistency checks read config["epochs"] etc.; no option's range is here
    for name in ("batch_size", "hidden_dim", "heads", "lr", "qat_lr", "dropout", "ema_decay"):
        assert f'"{name}"' not in src, name
    assert "10**9" not in src and "[0, 1)" not in src


@pytest.mark.parametrize(
    "kw",
    [{"heads": 2}, {"dropout": 0.2}, {"linear_skip": False}, {"skip_lr_scale": 0.5},
     {"qat_skip_lr_scale": 0.5}, {"skip_history": 48}],
)  # fmt: skip
def test_an_option_the_lstm_does_not_read_is_refused_everywhere(kw, capsys):
    ((name, value),) = kw.items()
    flag = _flag(name)
    for build in (TrainConfig, Forecaster):
        with pytest.raises(ValueError, match=f"{flag} is not used by --model lstm"):
            build(model="lstm", **kw)
    argv = [f"--no-{flag[2:]}"] if value is False else [flag, str(value)]
    assert main(["train", "--model", "lstm", *argv, "--check"]) == 2
    err = capsys.readouterr().err
    assert f"{flag} is not used by --model lstm" in err


def test_defaults_never_trigger_the_model_check():
    lstm = TrainConfig(model="lstm")
    assert lstm.resolved().heads == TrainConfig.FULL["heads"]  # resolved: no error
    TrainConfig(model="lstm", heads=TrainConfig.FULL["heads"], linear_skip=True)  # the defaults
    Forecaster(model="lstm", quick=True, heads=None)  # None: not given


def test_forecaster_refuses_an_unknown_keyword():
    with pytest.raises(TypeError, match="unknown option"):
        Forecaster(epoch=3)


def test_every_option_has_help_and_a_known_group():
    from nbqat.train.options import GROUPS

    for o in OPTIONS:
        assert o.help and o.group in GROUPS, o.name
        assert o.type in (int, float, str, bool), o.name


def test_a_skip_learning_rate_without_the_skip_is_refused(capsys):
    with pytest.raises(ValueError, match="--skip-lr-scale is an option of the linear skip"):
        TrainConfig(linear_skip=False, skip_lr_scale=0.5)
    with pytest.raises(ValueError, match="--qat-skip-lr-scale is an option of the linear skip"):
        Forecaster(linear_skip=False, qat_skip_lr_scale=0.5)
    with pytest.raises(ValueError, match="--skip-history is an option of the linear skip"):
        TrainConfig(linear_skip=False, skip_history="auto")
    assert main(["train", "--no-linear-skip", "--skip-lr-scale", "0.5", "--check"]) == 2
    assert "--skip-lr-scale is an option of the linear skip" in capsys.readouterr().err
    TrainConfig(linear_skip=False).resolved()  # the defaults: no error


@pytest.mark.parametrize("flag", ["--skip-lr-scale", "--qat-skip-lr-scale"])
def test_a_skip_option_given_at_its_default_without_the_skip_is_refused(flag, capsys):
    """--no-linear-skip --skip-lr-scale 0.1 (the default value) was taken and ignored, while
    --model lstm --skip-lr-scale 0.1 is refused: given on the command line counts."""
    assert main(["train", "--no-linear-skip", flag, "0.1", "--check"]) == 2
    assert f"{flag} is an option of the linear skip" in capsys.readouterr().err
    assert main(["train", flag, "0.1", "--check"]) == 0  # the skip is on by default


def test_a_finished_lstm_run_loads_without_the_tft_options(tmp_path, monkeypatch):
    """Forecaster.load passes the run's options back as keywords: an LSTM run's config holds
    the TFT's options at their defaults, which must not count as given."""
    import nbqat.train.predict as predict

    cfg = {**TrainConfig(model="lstm", quick=True).resolved().to_json(), "out": str(tmp_path)}
    tft_only = {k for k, o in config_options().items() if "lstm" not in o.models}
    assert tft_only == {"heads", "dropout", "linear_skip", "skip_lr_scale", "qat_skip_lr_scale",
                        "skip_history"}  # fmt: skip
    monkeypatch.setattr(predict, "load_run", lambda run_dir: (tmp_path, cfg))
    fc = Forecaster.load(tmp_path)
    assert fc.options["model"] == "lstm" and not tft_only & set(fc.options)
    assert fc.options["epochs"] == cfg["epochs"]


def test_a_checkpoint_without_a_later_option_reads_as_before_it(tmp_path):
    """A state.json written before --window-norm existed (no such key) loads with the
    behaviour of that release ('none'); any other missing option is still refused."""
    from nbqat.train.checkpointing import read_run_state

    cfg = TrainConfig(quick=True).resolved().to_json()
    cfg.update(history=24, csv=None)
    del cfg["window_norm"]
    _write_state(tmp_path, cfg)
    meta = read_run_state(tmp_path)
    assert meta["config"]["window_norm"] == "none"
    assert TrainConfig(**meta["config"]).window_norm == "none"
    del cfg["eval_stride"]
    _write_state(tmp_path, cfg)
    with pytest.raises(ckpt.CheckpointError, match="config.eval_stride'?: missing"):
        read_run_state(tmp_path)


def test_a_hidden_dim_too_large_for_memory_is_a_usage_error(tmp_path, capsys):
    """--hidden-dim 1000000 (586 TiB of parameters, past any address space) ended in NumPy's
    _ArrayMemoryError traceback; now 'nbqat train: error:' naming the option."""
    argv = ["train", "--hidden-dim", "1000000", "--heads", "1", "--out", str(tmp_path / "r")]
    assert main([*argv, "--check"]) == 2
    err = capsys.readouterr().err
    assert "nbqat train: error: --model tft with --hidden-dim 1000000 does not fit" in err
    assert "Traceback" not in err and not (tmp_path / "r").exists()


def test_the_tutorial_quotes_the_registry_quick_defaults():
    """The tutorial's option table said '--weight-decay ... `--quick` 0.1' (--quick keeps 0.3)."""
    import re

    text = (Path(__file__).resolve().parents[1] / "docs" / "tutorial.md").read_text()
    rows = re.findall(r"^\| `--([a-z-]+)`[^|]*\|([^\n]*)$", text, flags=re.M)
    quoted = {o.replace("-", "_"): float(v) for o, rest in rows
              for v in re.findall(r"`--quick` (\d+(?:\.\d+)?)", rest)}  # fmt: skip
    assert all(TrainConfig.QUICK[k] == v for k, v in quoted.items()), quoted
    assert "smaller network" not in text  # --quick keeps --hidden-dim


def test_an_out_inside_a_checkpoint_folder_is_refused(tmp_path, capsys, monkeypatch):
    """--out RUN/checkpoint was taken: the run's next checkpoint write moves that folder to
    checkpoint.old and then removes it, the new run's outputs with it."""
    ck = tmp_path / "run" / "checkpoint"
    ck.mkdir(parents=True)
    (ck / "state.json").write_text("{}")
    monkeypatch.chdir(tmp_path / "run")
    for out in (str(ck), str(ck / "sub"), "checkpoint"):
        assert main(["train", "--out", out, "--check"]) == 2
        assert f"is inside the checkpoint folder {str(ck)!r}" in capsys.readouterr().err
    assert sorted(p.name for p in ck.iterdir()) == ["state.json"]


@pytest.mark.parametrize("extra", [["--qat-lr", "0.01"], ["--compare-clipping"],
                                   ["--qat-skip-lr-scale", "0.5"]])  # fmt: skip
def test_a_qat_option_with_no_qat_epochs_is_refused(extra, capsys):
    """--qat-epochs 0 --qat-lr 0.01 (or --compare-clipping) was taken and ignored."""
    assert main(["train", "--qat-epochs", "0", *extra, "--check"]) == 2
    assert f"{extra[0]} is an option of the QAT steps" in capsys.readouterr().err
    with pytest.raises(ValueError, match="--compare-clipping is an option of the QAT steps"):
        TrainConfig(qat_epochs=0, compare_clipping=True).resolved()
