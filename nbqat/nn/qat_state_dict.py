"""torch's in-memory checkpoint pair for QAT models: ``state_dict`` / ``load_state_dict``.

:class:`QATStateDict` adds them to :class:`~nbqat.nn.qat_state.QATCheckpoint` (so to every QAT
model: :class:`~nbqat.nn.quantize.QATModel`, the QAT TFT), over the pieces its ``save`` writes:
the float model's parameter names, each quantizer's own ``state_dict`` under
``"<module path>.<hook>."`` and the phase under torch's ``"_extra_state"`` key. The optimizer
has its own ``state_dict``, as in torch. The result is a nested state that
:func:`nbqat.npz_state.save_state` writes as it is (one on-disk codec)::

    sd, osd = qat.state_dict(), opt.state_dict()      # mid-training
    fresh = prepare_qat(model_like_the_first)         # same network and QATConfig
    fresh.load_state_dict(sd); opt2 = nbqat.Adam(fresh.params, lr=1e-3); opt2.load_state_dict(osd)
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from nbqat.nn.qat_state import QATCheckpoint, check_phase_state
from nbqat.nn.state_dict import IncompatibleKeys, checked_param, match_keys, plain_values
from nbqat.npz_state import CheckpointError

__all__ = ["EXTRA_STATE", "IncompatibleKeys", "QATStateDict"]

#: The :meth:`QATStateDict.state_dict` key of the phase state (torch's key of a module's
#: ``get_extra_state()``).
EXTRA_STATE = "_extra_state"


class QATStateDict(QATCheckpoint):
    """:meth:`state_dict` / :meth:`load_state_dict` of a QAT model (see the module docstring)."""

    def _quantizer_states(self) -> dict[str, dict[str, Any]]:
        return {name: dict(fq.state_dict()) for name, fq in self.fake_quants.items()}

    def state_dict(self) -> dict[str, Any]:
        """The model's state as torch's ``nn.Module.state_dict``: parameters, quantizers, phase.

        Returns
        -------
        dict
            ``{"<float model's parameter name>": copy, "<module path>.<hook>.<key>": array,
            "_extra_state": {"phase", "observers_frozen", "calibration_batches_seen",
            "calibration_ended", "step"}}``: the parameters as the float model names them
            (``"0.weight"``), each quantizer's own ``state_dict`` (torch's keys: flags,
            ``scale``, ``zero_point``, ``activation_post_process.*``; ``"output_fake_quant.*"``
            for the TFT's output quantizer) and the QAT phase under torch's extra-state key.
            Copies (torch's tensors share the parameters' storage). No optimizer state: the
            optimizer has its own ``state_dict``. :func:`nbqat.npz_state.save_state` writes it.
        """
        out: dict[str, Any] = {n: np.array(p) for n, p in self.model.named_parameters()}
        for name, st in self._quantizer_states().items():
            out.update({f"{name}.{k}": v for k, v in st.items()})
        out[EXTRA_STATE] = self._phase_state()
        return out

    def load_state_dict(
        self, state_dict: Mapping[str, Any], strict: bool = True
    ) -> IncompatibleKeys:
        """Load a :meth:`state_dict` (torch's semantics), checked whole before anything changes.

        Parameters
        ----------
        state_dict : mapping
            From :meth:`state_dict` of a model prepared the same way (same network and
            quantizers; its parameter values, qparams and phase are loaded).
        strict : bool, default True
            As :meth:`nbqat.nn.Module.load_state_dict`: refuse other keys, or load the ones
            that match; returns the :class:`~nbqat.nn.state_dict.IncompatibleKeys`.

        Raises
        ------
        TypeError
            ``state_dict`` is not a mapping, or a parameter value not real numbers.
        CheckpointError
            (a ValueError; torch raises a RuntimeError) missing or unexpected keys under
            ``strict``, a parameter of another shape (torch's "size mismatch", with any
            ``strict``), a quantizer state its ``load_state_dict`` refuses, a bad
            ``"_extra_state"``. Nothing is changed then (torch may have copied some parameters
            by then).
        """
        own = self._quantizer_states()
        params = dict(self.model.named_parameters())
        keys = [*params, *(f"{n}.{k}" for n, st in own.items() for k in st), EXTRA_STATE]
        incompatible = match_keys(keys, state_dict, strict)
        state_dict = plain_values(state_dict)
        new = {n: checked_param(n, state_dict[n], p) for n, p in params.items() if n in state_dict}
        phase = check_phase_state(state_dict.get(EXTRA_STATE, self._phase_state()))
        self._load_quantizers(
            {
                name: {
                    **st,
                    **{k: state_dict[f"{name}.{k}"] for k in st if f"{name}.{k}" in state_dict},
                }
                for name, st in own.items()
            },
            own,
        )
        for n, v in new.items():
            params[n][...] = v
        self._set_phase_state(phase)
        return incompatible

    def _load_quantizers(self, states: dict[str, dict], before: dict[str, dict]) -> None:
        """Every quantizer's state, or none: a refusal rolls the loaded ones back."""
        done: list[str] = []
        for name, st in states.items():
            try:
                self.fake_quants[name].load_state_dict(st)
            except (KeyError, TypeError, ValueError) as e:
                for prev in reversed(done):
                    self.fake_quants[prev].load_state_dict(before[prev])
                raise CheckpointError(f"load_state_dict: quantizer {name}: {e}") from e
            done.append(name)
