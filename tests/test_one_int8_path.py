"""Issue 28, one int8 path: structural checks that fail when a second path returns, and the
public mechanisms that replaced the instance patching.

* no module of nbqat assigns ``forward`` / ``backward`` / ``__call__`` on an instance (the int8
  model swaps in integer modules; the quantizer report uses forward pre-hooks);
* one "observed yet?" check: the int8 conversion and the export raise the same exception;
* ``register_forward_pre_hook`` on the FakeQuantize family: the hook sees every input, leaves
  the output's bits alone (the oracle is an untouched copy of the quantizer), and its handle
  unregisters the hook.
"""

from __future__ import annotations

import ast
import copy
from pathlib import Path

import numpy as np
import pytest

from nbqat import FakeQuantize, LearnableFakeQuantize, QATConfig
from nbqat.nn import TemporalFusionTransformer, TFTConfig
from nbqat.nn.convert import QUANTIZED_MODULE_MAPPINGS, QuantizedLinear, QuantizedLSTM
from nbqat.nn.layers import LSTM, Linear
from nbqat.nn.qat import QATTemporalFusionTransformer
from nbqat.quantization._quantizer_base import UncalibratedError, check_observed, is_observed
from nbqat.quantization.lowbit_quantize import GroupFakeQuantize

PKG = Path(__file__).resolve().parents[1] / "nbqat"
PATCHED = {"forward", "backward", "__call__"}


def _instance_patches(tree: ast.AST) -> list[int]:
    """Lines that assign (or delete) ``<expr>.forward`` / ``.backward`` / ``.__call__``, or
    call ``setattr(obj, "forward", ...)`` (a literal name): a method replaced on an instance.
    A class body's own ``__call__ = forward`` is a Name target and is not counted."""
    lines = []
    for node in ast.walk(tree):
        targets: list[ast.AST] = []
        if isinstance(node, ast.Assign):
            targets = list(node.targets)
        elif isinstance(node, ast.AugAssign | ast.AnnAssign):
            targets = [node.target]
        elif isinstance(node, ast.Delete):
            targets = list(node.targets)
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in ("setattr", "delattr")
            and len(node.args) >= 2
            and isinstance(node.args[1], ast.Constant)
            and node.args[1].value in PATCHED
        ):
            lines.append(node.lineno)
        for t in targets:
            for sub in ast.walk(t):
                if isinstance(sub, ast.Attribute) and sub.attr in PATCHED:
                    lines.append(node.lineno)
    return lines


def _modules() -> dict[str, Path]:
    mods = {}
    for p in PKG.rglob("*.py"):
        parts = list(p.relative_to(PKG.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        mods[".".join(parts)] = p
    return mods


@pytest.mark.parametrize("path", sorted(PKG.rglob("*.py")), ids=lambda p: p.name)
def test_no_module_assigns_a_method_on_an_instance(path):
    hits = _instance_patches(ast.parse(path.read_text(encoding="utf-8")))
    assert not hits, f"{path.relative_to(PKG.parent)}: instance method patched at lines {hits}"


def test_the_instance_patch_check_can_fail():
    src = """
class A:
    def forward(self, x):
        return x
    __call__ = forward
a = A()
a.forward = print
m.layer.backward = None
setattr(a, "__call__", print)
del a.forward
"""
    assert sorted(_instance_patches(ast.parse(src))) == [7, 8, 9, 10]


# ----------------------------------------------------------------------------- one check
K, TAU = 4, 2


def _qat(calibrate: bool) -> QATTemporalFusionTransformer:
    cfg = TFTConfig(
        num_static_features=2,
        num_known_features=2,
        num_unknown_features=3,
        hidden_dim=8,
        sequence_length=K,
        prediction_horizon=TAU,
        num_heads=2,
    )
    q = QATTemporalFusionTransformer.from_float(
        TemporalFusionTransformer(cfg, seed=3), config=QATConfig(calibration_batches=1)
    )
    if calibrate:
        rng = np.random.default_rng(0)
        b = (
            rng.standard_normal((6, 2)).astype(np.float32),
            rng.standard_normal((6, K, 3)).astype(np.float32),
            rng.standard_normal((6, TAU, 2)).astype(np.float32),
        )
        q.calibrate([b])
        q.freeze_observers()
    return q


def test_conversion_and_export_share_one_uncalibrated_error(tmp_path):
    from nbqat.export import to_onnx

    q = _qat(calibrate=False)
    with pytest.raises(UncalibratedError) as conv:
        q.to_int8()
    with pytest.raises(UncalibratedError) as exp:
        to_onnx(q, tmp_path / "m.onnx")
    assert isinstance(conv.value, RuntimeError) and isinstance(exp.value, ValueError)
    assert "is uncalibrated (it has never observed data" in str(conv.value)
    assert str(exp.value).split("'")[2] == str(conv.value).split("'")[2]  # one message
    assert not (tmp_path / "m.onnx").exists()


def test_is_observed_follows_the_observer_statistics():
    fq = FakeQuantize()
    assert not is_observed(fq)
    with pytest.raises(UncalibratedError, match="'a.b' is uncalibrated"):
        check_observed({"a.b": fq, "none": None})
    fq.forward(np.array([-1.0, 2.0], np.float32))
    assert is_observed(fq)
    check_observed({"a.b": fq})
    g = GroupFakeQuantize(group_size=4)
    assert not is_observed(g)
    g.forward(np.ones((2, 8), np.float32))
    assert is_observed(g)


def test_the_tft_int8_model_holds_integer_modules():
    q = _qat(calibrate=True)
    int8 = q.to_int8()
    src = dict(q.model.named_modules())
    kinds = {Linear: QuantizedLinear, LSTM: QuantizedLSTM}
    assert {k: v for k, v in QUANTIZED_MODULE_MAPPINGS.items() if k in kinds} == kinds
    n = 0
    for name, mod in int8.model.named_modules():
        s = src[name]
        if type(s) in kinds and (
            getattr(s, "weight_fake_quant", None) or getattr(s, "weight_ih_fake_quant", None)
        ):
            assert type(mod) is kinds[type(s)]
            assert int8.layers[name] is mod.int8
            n += 1
        assert "forward" not in vars(mod)
    assert n == len(int8.layers) > 10


# ----------------------------------------------------------------------------- pre-hooks
def _quantizers():
    return [
        ("fake_quantize", FakeQuantize(), np.float32),
        ("lsq", LearnableFakeQuantize(), np.float32),
        ("group", GroupFakeQuantize(group_size=4), np.float32),
    ]


@pytest.mark.parametrize("kind", ["fake_quantize", "lsq", "group"])
def test_forward_pre_hook_sees_inputs_and_changes_no_bit(kind, rng):
    fq, dt = next((f, d) for k, f, d in _quantizers() if k == kind)
    ref = copy.deepcopy(fq)
    before = set(vars(fq))
    seen = []
    handle = fq.register_forward_pre_hook(lambda m, args: seen.append((m, args[0].copy())))
    xs = [(3 * rng.standard_normal((4, 8))).astype(dt) for _ in range(3)]
    for x in xs:
        np.testing.assert_array_equal(np.asarray(fq.forward(x)), np.asarray(ref.forward(x)))
    assert len(seen) == 3 and all(m is fq for m, _ in seen)
    for (_, got), x in zip(seen, xs, strict=True):
        np.testing.assert_array_equal(got, x)
    handle.remove()
    handle.remove()  # a second remove does nothing
    assert set(vars(fq)) <= before | {"_forward_pre_hooks"} and not fq._forward_pre_hooks
    fq.forward(xs[0])
    assert len(seen) == 3


def test_forward_pre_hook_may_replace_the_input(rng):
    fq, ref = FakeQuantize(), FakeQuantize()
    x = rng.standard_normal((5, 3)).astype(np.float32)
    with fq.register_forward_pre_hook(lambda m, args: (args[0] * np.float32(2),)):
        y = fq.forward(x)
    np.testing.assert_array_equal(y, ref.forward(x * np.float32(2)))
    assert not fq._forward_pre_hooks  # removed on exit
    with pytest.raises(TypeError, match="callable"):
        fq.register_forward_pre_hook(3)
