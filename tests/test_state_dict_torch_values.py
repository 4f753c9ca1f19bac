"""``load_state_dict`` takes torch's own values as torch does: Parameters that require grad
(``state_dict(keep_vars=True)``, ``dict(named_parameters())``) and bfloat16 tensors.

Oracle: torch's ``load_state_dict`` of the same values into the same float32 network, whose
forward nbqat's must then give."""

from __future__ import annotations

import numpy as np
import pytest

import nbqat
from nbqat import nn


def _pair(torch):
    model = nn.Sequential(nn.Linear(3, 4), nn.ELU(), nn.LayerNorm(4), nn.Linear(4, 2))
    nn.ParameterBuffer(model, seed=0)
    ref = torch.nn.Sequential(
        torch.nn.Linear(3, 4), torch.nn.ELU(), torch.nn.LayerNorm(4), torch.nn.Linear(4, 2)
    )
    return model, ref


@pytest.mark.parametrize("kind", ["keep_vars", "named_parameters", "bfloat16"])
def test_torch_parameters_and_bfloat16_load_as_in_torch(torch, rng, kind):
    model, ref = _pair(torch)
    src = _pair(torch)[1]
    torch.nn.init.normal_(src[2].weight)
    if kind == "bfloat16":
        src = src.bfloat16()
    sd = {
        "keep_vars": lambda: src.state_dict(keep_vars=True),
        "named_parameters": lambda: dict(src.named_parameters()),
        "bfloat16": src.state_dict,
    }[kind]()
    assert ref.load_state_dict(sd) == model.load_state_dict(sd) == ([], [])
    x = rng.standard_normal((5, 3)).astype(np.float32)
    want = ref(torch.from_numpy(x)).detach().numpy()
    np.testing.assert_allclose(model(x), want, rtol=1e-5, atol=1e-6)
    # the QAT model's load takes them too (its float parameters)
    qat = nn.prepare_qat(model, config=nbqat.QATConfig(calibration_batches=1))
    assert qat.load_state_dict(sd, strict=False).unexpected_keys == []
    np.testing.assert_array_equal(qat.model[3].bias, ref[3].bias.detach().numpy())


def test_lstm_keys_are_torchs_without_the_layer_suffix(torch, rng):
    """docs/from-pytorch.md: nbqat's LSTM names its parameters as torch's one-layer
    ``nn.LSTM`` without ``_l0``, in torch's layouts and gate order (torch's output)."""
    model, ref = nn.LSTM(3, 4), torch.nn.LSTM(3, 4, batch_first=True)
    nn.ParameterBuffer(model, seed=0)
    sd = ref.state_dict()
    assert list(model.state_dict()) == [k.removesuffix("_l0") for k in sd]
    model.load_state_dict({k.removesuffix("_l0"): v for k, v in sd.items()})
    x = rng.standard_normal((2, 5, 3)).astype(np.float32)
    h0 = np.zeros((2, 4), np.float32)
    out, _ = model(x, h0, h0)
    want = ref(torch.from_numpy(x))[0].detach().numpy()
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-6)


def test_a_model_without_its_buffer_names_the_fix(torch):
    """torch's modules own their parameters from construction, so ``load_state_dict`` right
    after it is torch's habit; an nbqat model's parameters come from its ParameterBuffer, and
    state_dict / load_state_dict raised AttributeError "'NoneType' object has no attribute
    'copy'" / "'shape'" before one. Now a RuntimeError naming the parameters and the fix."""
    model = nn.Sequential(nn.Linear(3, 4), nn.ELU(), nn.Linear(4, 2))
    sd = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ELU(), torch.nn.Linear(4, 2))
    for call in (model.state_dict, lambda: model.load_state_dict(sd.state_dict())):
        with pytest.raises(RuntimeError, match=r"\['0.weight', .*ParameterBuffer\(model\)"):
            call()
    nn.ParameterBuffer(model)
    assert model.load_state_dict(sd.state_dict()) == ([], [])
