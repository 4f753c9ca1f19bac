"""The linear skip's int8 input range on trending data (issue 31).

The TFT's ridge-started linear skip reads the flattened window, the standardised target's
history among it, through one per-tensor activation quantizer calibrated on training
windows. On a trending series (a level that keeps rising) the test windows' targets lie
beyond every training value, the quantizer clamps them at the calibrated maximum and the
int8 skip stops following the level: QAT int8 was about +100 % (``us_employment``) and
+2,400 % (``co2``) worse than the fine-tuned float on the held-out collection, and disabling
that one quantizer alone brought it back to within 1 %.

The rule: where the validation targets (standardised) leave the training targets' range,
the drift is assumed to go on for one more split, and the quantizer's range is widened to
cover it: ``hi' = max(hi, v_max + (v_max - t_max))`` when ``v_max > t_max`` (and the mirror
rule below the minimum). Where the validation targets stay inside the training range
(stationary data, the shipped dataset) nothing changes. Only the training and validation
splits are read; the rule is idempotent, so a resumed run applies it again with the same
result.
"""

from __future__ import annotations

from typing import Any

import numpy as np

#: The quantizer the rule widens (``QATTemporalFusionTransformer.fake_quants`` key).
SKIP_INPUT = "linear_skip.input_fake_quant"


def drift_bounds(w: Any) -> dict:
    """The range the validation split's drift asks the skip input to cover.

    Parameters
    ----------
    w : nbqat.data.Windows
        The run's windows (``w.train`` and ``w.val`` are read, never ``w.test``).

    Returns
    -------
    dict
        ``train`` and ``val``: ``[min, max]`` of the split's standardised forecast targets
        (float); ``bounds``: ``[lo, hi]`` to cover, ``lo = v_min - (t_min - v_min)`` where
        ``v_min < t_min`` else None, ``hi = v_max + (v_max - t_max)`` where ``v_max > t_max``
        else None.
    """
    t, v = w.train.target(), w.val.target()
    tl, th, vl, vh = (float(x) for x in (t.min(), t.max(), v.min(), v.max()))
    lo = vl - (tl - vl) if vl < tl else None
    hi = vh + (vh - th) if vh > th else None
    return {"train": [tl, th], "val": [vl, vh], "bounds": [lo, hi]}


def widen_skip_input(model: Any, w: Any) -> dict | None:
    """Widen the linear skip's input quantizer by :func:`drift_bounds` (in place).

    The observer's ``min_val`` / ``max_val`` take the bounds (never narrowed; its
    ``set_min_max``, float32) and the
    quantizer's ``scale`` / ``zero_point`` are recomputed by the observer
    (``calculate_qparams``), as at the end of calibration.

    Parameters
    ----------
    model : QAT forecaster
        Its ``fake_quants`` (dict by name); a model without :data:`SKIP_INPUT` (no linear
        skip, the LSTM) is left alone.
    w : nbqat.data.Windows
        The run's windows.

    Returns
    -------
    dict or None
        None where nothing changed (no such quantizer, or the validation targets inside the
        training range); else :func:`drift_bounds`' record with ``calibrated`` and ``range``
        (``[min_val, max_val]`` before and after) and the new ``scale`` and ``zero_point``.
    """
    fq = getattr(model, "fake_quants", {}).get(SKIP_INPUT)
    if fq is None:
        return None
    rec = drift_bounds(w)
    lo, hi = rec["bounds"]
    if lo is None and hi is None:
        return None
    ob = fq.activation_post_process
    before = [float(ob.min_val), float(ob.max_val)]
    f32 = np.float32
    mn = np.minimum(ob.min_val, f32(lo)) if lo is not None else ob.min_val
    mx = np.maximum(ob.max_val, f32(hi)) if hi is not None else ob.max_val
    ob.set_min_max(mn, mx)
    scale, zero_point = fq.calculate_qparams()
    fq.scale[...] = scale
    fq.zero_point[...] = zero_point
    rec.update(
        calibrated=before,
        range=[float(ob.min_val), float(ob.max_val)],
        scale=float(fq.scale[0]),
        zero_point=int(fq.zero_point[0]),
    )
    return rec


__all__ = ["SKIP_INPUT", "drift_bounds", "widen_skip_input"]
