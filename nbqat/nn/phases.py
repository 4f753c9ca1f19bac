"""The QAT phase switches shared by every prepared model (torch.ao's FakeQuantize states).

:class:`QATPhases` is the base of :class:`~nbqat.nn.qat.QATTemporalFusionTransformer` and of
the generic :class:`~nbqat.nn.quantize.QATModel` that :func:`~nbqat.nn.quantize.prepare_qat`
returns. A subclass provides ``fake_quants`` (``"<module path>.<hook>" -> quantizer``),
``config`` (a :class:`~nbqat.QATConfig`) and ``_observe_only`` (names that observe but never
fake-quantize); the phases are

1. calibration (:meth:`enable_calibration`): observers on, fake quantization off -- the
   forward pass is the float model's;
2. QAT (:meth:`disable_calibration`): observers (unless frozen) and fake quantization on;
3. frozen (:meth:`freeze_observers`): fake quantization with fixed qparams;

and, orthogonal to them, PyTorch's :meth:`train` / :meth:`eval` modes: in eval mode NO observer
ever updates (torch leaves observers running after ``model.eval()``, a common pitfall: its
evaluation then moves the ranges) and fake quantization uses the frozen qparams.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import numpy as np

from nbqat.quantization._quantizer_base import is_observed

__all__ = ["CALIBRATION", "QAT", "QATPhases", "QuantizerParameters", "is_learnable"]

#: Phase names.
CALIBRATION = "calibration"
QAT = "qat"


def is_learnable(fq: Any) -> bool:
    """Whether a quantizer learns its scale / zero point (the LSQ protocol: it has a
    ``learnable`` attribute set to True, or LSQ's ``grad_scale`` buffer)."""
    flag = getattr(fq, "learnable", None)
    return bool(flag) if flag is not None else hasattr(fq, "grad_scale")


class QATPhases:
    """Calibration / QAT / frozen phases and train / eval modes over ``self.fake_quants``."""

    fake_quants: dict[str, Any]
    config: Any
    model: Any  # the float network being quantized
    step: int  # training steps taken (a checkpoint saves it, with the optimizer)
    optimizer: Any
    _observe_only: set[str]
    _caches_from_predict = False  # predict ran after the last forward (its caches are gone)

    def _init_phases(self) -> None:
        self.phase = CALIBRATION
        self.observers_frozen = False
        self.calibration_batches_seen = 0
        self._calibration_ended = False
        self.training = True

    def count_step(self, optimizer: Any) -> None:
        """Record one training step taken with ``optimizer`` (:func:`nbqat.nn.train_step` calls
        it; the QAT checkpoint saves the count and the optimizer's state).

        Parameters
        ----------
        optimizer : nbqat optimizer
        """
        self.step += 1
        self.optimizer = optimizer

    def learnable_quantizers(self) -> list[Any]:
        """The quantizers that learn their scale / zero point (LSQ), in ``fake_quants`` order."""
        return [fq for fq in self.fake_quants.values() if is_learnable(fq)]

    _learnable = learnable_quantizers

    @contextlib.contextmanager
    def sharded(self, local_rows: int, global_rows: int) -> Iterator[None]:
        """While a data-parallel step trains on ``local_rows`` of a ``global_rows`` batch: the
        learnable activation quantizers' :attr:`~nbqat.LearnableFakeQuantize.shard_rows`, so
        their LSQ gradient factor is the one-process run's (the weights' are unchanged: every
        rank quantizes the whole weight).

        Parameters
        ----------
        local_rows, global_rows : int
            This rank's rows and the global batch's.

        Raises
        ------
        ValueError
            An activation quantizer observes (calibration, or QAT with observers not frozen)
            without being synced over the ranks (:func:`nbqat.distributed.sync_observers`):
            each rank's qparams would follow its own slice, and the ranks' models part.
        """
        kinds = getattr(self, "quantizer_kinds", {})
        unsynced = [
            name
            for name, fq in self.fake_quants.items()
            if kinds.get(name) == "activation"
            and fq.observer_enabled
            and getattr(fq, "qscheme", None) != "per_token_affine"  # row-local qparams
            and getattr(getattr(fq, "activation_post_process", fq), "process_group", 0) is None
        ]
        if unsynced:
            raise ValueError(
                f"a data-parallel step observes activations through quantizers not synced over "
                f"the ranks ({unsynced[:3]}, {len(unsynced)} in all): each rank's qparams "
                "would follow its own slice. Call nbqat.distributed.sync_observers("
                "qat.fake_quants, group) first (nbqat.distributed.calibrate does), or "
                "qat.freeze_observers()"
            )
        acts = [
            fq
            for name, fq in self.fake_quants.items()
            if is_learnable(fq) and kinds.get(name) == "activation" and hasattr(fq, "shard_rows")
        ]
        for fq in acts:
            fq.shard_rows = (int(local_rows), int(global_rows))
        try:
            yield
        finally:
            for fq in acts:
                fq.shard_rows = None

    def quantizer_parameters(self) -> QuantizerParameters:
        """The LSQ scales and zero points as one optimizer parameter group source (the same
        object every call; see :class:`QuantizerParameters`)."""
        src = self.__dict__.get("_quantizer_parameters")
        if src is None:
            src = self.__dict__["_quantizer_parameters"] = QuantizerParameters(self)
        return src

    def quantizer_param_group(self, **hparams: Any) -> dict[str, Any]:
        """``{"params": self.quantizer_parameters(), **hparams}`` for the optimizer's
        ``add_param_group`` (torch's habit: ``Adam([weights, {"params": scales, "lr": ..}])``).

        Parameters
        ----------
        **hparams
            Hyper-parameter overrides of the group (e.g. ``lr=1e-4``); the rest are the
            optimizer's.

        Returns
        -------
        dict
        """
        return {"params": self.quantizer_parameters(), **hparams}

    def _apply_flags(self) -> None:
        observe = (self.phase == CALIBRATION or not self.observers_frozen) and self.training
        fake = self.phase == QAT
        for name, fq in self.fake_quants.items():
            obs = observe
            if fake and is_learnable(fq):
                # LSQ: after calibration the scales are learned (unless frozen), not observed
                obs = False
                fq.learning_enabled = not self.observers_frozen and self.training
            elif is_learnable(fq):
                fq.learning_enabled = False
            fq.enable_observer(obs)
            fq.enable_fake_quant(fake and name not in self._observe_only)

    def enable_calibration(self) -> None:
        """Calibration phase: observers on, fake quantization off (the float forward).

        Resets :attr:`calibration_batches_seen`; the phase ends by itself at the first forward
        after ``config.calibration_batches`` calibration forwards, or with
        :meth:`disable_calibration`.
        """
        self.phase = CALIBRATION
        self.observers_frozen = False
        self.calibration_batches_seen = 0
        self._calibration_ended = False
        self._apply_flags()

    def disable_calibration(self) -> None:
        """QAT phase: observers (unless frozen) and fake quantization on (torch's QAT state).

        With ``config.freeze_observers_after_calibration`` the observers are frozen too.
        """
        if self.phase == CALIBRATION and self.calibration_batches_seen > 0:
            self._calibration_ended = True
        self.phase = QAT
        if self.config.freeze_observers_after_calibration:
            self.observers_frozen = True
        self._apply_flags()

    def freeze_observers(self, frozen: bool = True) -> None:
        """Stop (``frozen=True``) or restart updating every observer; fake quantization then
        uses fixed scales and zero points (torch's ``disable_observer``).

        Parameters
        ----------
        frozen : bool, default True
            True stops the observers (and the LSQ scale updates) in the QAT phase; False lets
            them update again. The phase is not changed, and calibration always observes.
        """
        self.observers_frozen = bool(frozen)
        self._apply_flags()

    def _count_calibration_batch(self) -> None:
        """Count a calibration forward, unless no activation quantizer has observed data yet
        (a batch of no rows observes nothing: counting it ended calibration, frozen with
        ``freeze_observers_after_calibration``, with scale-1 quantizers)."""
        kinds = getattr(self, "quantizer_kinds", {})
        acts = [fq for name, fq in self.fake_quants.items() if kinds.get(name) == "activation"]
        if not acts or any(is_observed(fq) for fq in acts):
            self.calibration_batches_seen += 1

    def _check_backward(self) -> None:
        """Refuse a backward whose forward caches were replaced by :meth:`predict`'s."""
        if self._caches_from_predict:
            raise RuntimeError(
                "backward after predict: predict's forward replaced the layers' caches of the "
                "last forward, so the gradient would be of predict's inputs; run the training "
                "forward again (out = qat(*inputs)) before backward, or predict after backward"
            )

    @property
    def is_calibrated(self) -> bool:
        """True once ``config.calibration_batches`` calibration forwards ran, or calibration
        was ended by :meth:`disable_calibration` after at least one calibration forward."""
        return self._calibration_ended or (
            self.calibration_batches_seen >= self.config.calibration_batches
            and self.calibration_batches_seen > 0
        )

    def train(self, mode: bool = True) -> Any:
        """Training mode (the default): observers follow the phase. Returns self.

        Parameters
        ----------
        mode : bool, default True
            False is :meth:`eval`.
        """
        self.training = bool(mode)
        self.model.train(mode)
        self._apply_flags()
        return self

    def eval(self) -> Any:
        """Evaluation mode: no observer updates (unlike torch), fake quantization with the
        current qparams in the QAT phase; :meth:`train` restores the phase's behaviour.
        Returns self."""
        return self.train(False)


class QuantizerParameters:
    """The learnable (LSQ) scales and zero points of a QAT model as one parameter source for
    the optimizer's parameter groups (:meth:`nbqat.optim.SGD.add_param_group`).

    ``gather()`` concatenates ``[scale, zero_point]`` of every learnable quantizer (in
    ``fake_quants`` order) and their gradients into two flat float32 arrays; ``scatter(flat)``
    writes them back into the quantizers whose learning is enabled (a quantizer in the
    calibration phase, frozen, or in eval mode keeps its values) and clamps each scale to
    ``>= eps`` as torch's LSQ forward does.

    Parameters
    ----------
    owner : QATPhases
        The QAT model (its :meth:`~QATPhases.learnable_quantizers` are read at every call).
    """

    def __init__(self, owner: QATPhases) -> None:
        self.owner = owner

    def gather(self) -> tuple[np.ndarray, np.ndarray]:
        """``(params, grads)``: flat float32 copies, ``2 * sum(scale.size)`` long."""
        from nbqat.optim_groups import ArrayGroup

        qs = self.owner.learnable_quantizers()
        p = [a for fq in qs for a in (fq.scale, fq.zero_point)]
        g = [a for fq in qs for a in (fq.grad_scale, fq.grad_zero_point)]
        return ArrayGroup(p, g).gather()  # float32 (LSQ keeps its qparams in float32)

    def arrays(self) -> list[np.ndarray]:
        """The learnable quantizers' scale and zero-point arrays (updated in place)."""
        return [a for fq in self.owner.learnable_quantizers() for a in (fq.scale, fq.zero_point)]

    def scatter(self, params: np.ndarray) -> None:
        """Write the updated flat ``params`` back (see the class docstring)."""
        off = 0
        for fq in self.owner.learnable_quantizers():
            n = fq.scale.size
            if getattr(fq, "learning_enabled", True):
                fq.scale[...] = params[off : off + n].reshape(fq.scale.shape)
                fq.zero_point[...] = params[off + n : off + 2 * n].reshape(fq.zero_point.shape)
                np.maximum(fq.scale, fq.eps, out=fq.scale)
            off += 2 * n
