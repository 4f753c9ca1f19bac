"""The public mapping from float layer types to their QAT hooks (:data:`QAT_MODULE_MAPPINGS`).

Each float layer type maps to ``{hook attribute: "weight" | "activation"}``: the attributes its
``forward`` calls quantizers through and the qconfig factory that builds each. A ``Linear``
gets a per-channel weight quantizer and a per-tensor input quantizer, an ``LSTM`` both weights,
its input and its hidden state at every step, the attention its probabilities; LayerNorm and
the variable embeddings hold parameters but no matmul and map to ``{}`` (float by design).
:func:`register_qat_module` adds a user's layer type; :func:`~nbqat.nn.prepare_qat` reads the
mapping (through :func:`hooks_for`) for every model, the TFT's QAT model included, and picks
each module's QConfig with :func:`qconfig_for` (torch's ``QConfigMapping`` precedence) from a
``qconfig_mapping`` checked by :func:`check_qconfig_mapping`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from nbqat.nn.params import Module

__all__ = [
    "QAT_MODULE_MAPPINGS",
    "check_bound",
    "check_qconfig_mapping",
    "config_qconfig_mapping",
    "hooks_for",
    "is_qconfig",
    "qconfig_for",
    "register_qat_module",
]


def _default_mappings() -> dict[type, dict[str, str]]:
    from nbqat.nn.layers import (
        LSTM,
        InterpretableMultiHeadAttention,
        LayerNorm,
        Linear,
        VariableEmbedding,
    )

    return {
        Linear: {"weight_fake_quant": "weight", "input_fake_quant": "activation"},
        LSTM: {
            "weight_ih_fake_quant": "weight",
            "weight_hh_fake_quant": "weight",
            "input_fake_quant": "activation",
            "hidden_fake_quant": "activation",
        },
        InterpretableMultiHeadAttention: {"attention_fake_quant": "activation"},
        LayerNorm: {},  # float by design (as torch eager QAT and ModelOpt)
        VariableEmbedding: {},  # element-wise w_j x_j + b_j: no matmul to quantize
    }


#: Float layer type -> ``{hook attribute: "weight" | "activation"}`` (public and extensible).
QAT_MODULE_MAPPINGS: dict[type, dict[str, str]] = _default_mappings()


def register_qat_module(layer_type: type, hooks: Mapping[str, str]) -> None:
    """Teach :func:`prepare_qat` a layer type.

    Parameters
    ----------
    layer_type : type
        A :class:`~nbqat.nn.Module` subclass whose ``forward`` calls quantization hooks held
        in attributes (``self.weight_fake_quant(self.weight)``, ...) and whose ``backward``
        calls their ``backward(grad, ctx)`` (see :class:`~nbqat.nn.Linear`'s Notes).
    hooks : mapping of str to {"weight", "activation"}
        Hook attribute name -> which qconfig factory builds its quantizer; ``{}`` keeps the
        layer in float on purpose.

    Raises
    ------
    TypeError
        ``layer_type`` is not a Module subclass; ``hooks`` not a mapping, or a key that is
        not an attribute name.
    ValueError
        A hook kind other than "weight" / "activation".
    """
    if not (isinstance(layer_type, type) and issubclass(layer_type, Module)):
        raise TypeError(
            f"register_qat_module: layer_type must be a Module subclass, got {layer_type!r}"
        )
    if not isinstance(hooks, Mapping):
        raise TypeError(
            "register_qat_module: hooks must be a mapping of hook attribute to kind, e.g. "
            f'{{"weight_fake_quant": "weight"}}, got {type(hooks).__name__}'
        )
    names = [k for k in hooks if not (isinstance(k, str) and k.isidentifier())]
    if names:
        raise TypeError(f"register_qat_module: hook names must be attribute names, got {names}")
    bad = {k: v for k, v in hooks.items() if v not in ("weight", "activation")}
    if bad:
        raise ValueError(f"register_qat_module: hook kinds must be 'weight'/'activation': {bad}")
    QAT_MODULE_MAPPINGS[layer_type] = dict(hooks)


def hooks_for(mod: Module) -> dict[str, str] | None:
    """The hook mapping of ``mod``'s type (or of its nearest mapped base class); None when
    the type has no mapping."""
    for cls in type(mod).__mro__:
        if cls in QAT_MODULE_MAPPINGS:
            return QAT_MODULE_MAPPINGS[cls]
    return None


def config_qconfig_mapping(model: Module, config: Any) -> dict[str, None]:
    """The float fallback that ``config``'s switches ask for (``{module name: None}``), which
    :func:`~nbqat.nn.prepare_qat` applies under its ``qconfig_mapping`` (an entry there wins).

    Parameters
    ----------
    model : Module
    config : QATConfig
        ``quantize_output_head=False`` (the default) keeps the module named by the model's
        ``output_head`` attribute in float (the forecasters' quantile heads; a model without
        the attribute has no head to keep); ``quantize_linear_skip=False`` keeps the model's
        ``linear_skip`` module (the TFT's, when it has one) in float;
        ``quantize_attention=False`` keeps every InterpretableMultiHeadAttention (its
        projections included) in float.

    Returns
    -------
    dict
    """
    from nbqat.nn.layers import InterpretableMultiHeadAttention

    mapping: dict[str, None] = {}
    head = getattr(model, "output_head", None)
    if isinstance(head, str) and not config.quantize_output_head:
        mapping[head] = None
    if getattr(model, "linear_skip", None) is not None and not config.quantize_linear_skip:
        mapping["linear_skip"] = None  # the TFT's: it writes the output beside the head
    if not config.quantize_attention:
        for name, mod in model.named_modules():
            if isinstance(mod, InterpretableMultiHeadAttention):
                mapping[name] = None
    return mapping


def qconfig_for(name: str, mod: Module, qconfig: Any, mapping: Mapping[Any, Any]) -> Any:
    """torch's QConfigMapping precedence: module name (or an ancestor's) > type > global."""
    parts = name.split(".") if name else []
    for i in range(len(parts), -1, -1):  # i = 0: "", the root (config_qconfig_mapping's)
        key = ".".join(parts[:i])
        if key in mapping:
            return mapping[key]
    for cls in type(mod).__mro__:
        if cls in mapping:
            return mapping[cls]
    return qconfig


def is_qconfig(qc: Any) -> bool:
    """Whether ``qc`` has a callable ``weight`` factory and a callable or None
    ``activation`` (None: float activations, weight-only)."""
    act = getattr(qc, "activation", False)  # None: float activations (weight-only)
    return callable(getattr(qc, "weight", None)) and (act is None or callable(act))


def check_bound(model: Module) -> None:
    """Every parameter of ``model`` lives in a ParameterBuffer (checked before any change)."""
    missing = [n for n, p in model.named_parameters() if p is None]
    if missing:
        raise ValueError(
            f"model has unbound parameters {missing[:3]}: build its ParameterBuffer first "
            "(ParameterBuffer(model, dtype=np.float32, seed=0))"
        )


def _check_type_key(model: Module, key: type) -> None:
    """A type entry acts on the modules of that type only: one that matches composites (a GRN:
    no hook of its own, its children's) would change nothing, where torch's eager qconfig
    dict would cover the children."""
    matched = [(n, m) for n, m in model.named_modules() if isinstance(m, key)]
    inner = any(hooks_for(c) for _, m in matched for _, c in m.named_modules() if c is not m)
    if inner and not any(hooks_for(m) for _, m in matched):
        raise ValueError(
            f"prepare_qat: qconfig_mapping[{key.__name__}] matches modules "
            f"{[n or '<root>' for n, _ in matched][:6]} that hold no quantizer (a type entry "
            "does not cover a module's children): name those modules instead (a name covers "
            f"its descendants), e.g. qconfig_mapping={{{matched[0][0]!r}: None}}"
        )


def check_qconfig_mapping(model: Module, qconfig: Any, qconfig_mapping: Any) -> dict:
    """The checked ``qconfig_mapping`` as a dict: every name a module of ``model`` (a typo
    would silently quantize what was meant to stay float), every value a QConfig or None."""
    if not is_qconfig(qconfig):
        raise TypeError(
            f"prepare_qat: qconfig must be a QConfig (weight and activation factories, e.g. "
            f"nbqat.default_qat_qconfig), got {type(qconfig).__name__}"
        )
    if qconfig_mapping is None:
        return {}
    if not isinstance(qconfig_mapping, Mapping):
        raise TypeError(
            "prepare_qat: qconfig_mapping must be a mapping {module name or layer type: "
            f"QConfig or None}}, got {type(qconfig_mapping).__name__}"
        )
    names = [n for n, _ in model.named_modules() if n]
    for key, qc in qconfig_mapping.items():
        if isinstance(key, str):
            if key not in names:
                raise ValueError(
                    f"prepare_qat: qconfig_mapping names module {key!r}, which the model does "
                    f"not have; its modules are {names[:12]}{' ...' if len(names) > 12 else ''}"
                )
        elif not (isinstance(key, type) and issubclass(key, Module)):  # int would match nothing
            raise TypeError(
                f"prepare_qat: qconfig_mapping keys must be module names (str) or layer types "
                f"(nbqat.nn.Module subclasses, e.g. nbqat.nn.Linear), got {key!r}"
            )
        else:
            _check_type_key(model, key)
        if qc is not None and not is_qconfig(qc):
            raise TypeError(
                f"prepare_qat: qconfig_mapping[{key!r}] must be a QConfig or None, got "
                f"{type(qc).__name__}"
            )
    return dict(qconfig_mapping)
