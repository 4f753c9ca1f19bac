"""The int8 rows of a run in another weight format (``--weight-bits 4``, ``--weight-dtype
float8_e4m3fn``): the default run's PTQ and QAT int8 models, replayed from the run's best float
weights, so that metrics.json and the summary compare the chosen format with int8 (issue 30).
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any

from nbqat.train.loop import Interrupt, Run
from nbqat.train.model import build_model, set_dropout_mode

__all__ = ["int8_reference_rows"]


def int8_reference_rows(r: Run) -> dict:
    """The ``ptq_int8`` and ``qat_int8`` rows of a run trained in another weight format.

    The default (``--weight-bits 8``) run's calibration and QAT phases, replayed from ``r``'s
    best float weights with the same calibration and QAT batches, schedule, dropout masks,
    clipping and optimizer: with the same seed and options the rows are the default run's
    ``ptq_int8`` and ``int8`` rows, bit for bit. Its progress is not shown; its time is
    ``timings.json``'s ``int8_reference``.

    Parameters
    ----------
    r : Run
        After QAT, its weight format not int8 (every rank calls it: the QAT steps are
        collective under MPI).

    Returns
    -------
    dict
        ``{"ptq_int8": q-risks, "qat_int8": q-risks}`` (P10/P50/P90 on the test split).
    """
    from nbqat.train.recipe import ptq_row

    t0 = time.perf_counter()
    cfg8 = replace(r.cfg, weight_bits=8, group_size=None, weight_dtype="int",
                   compare_clipping=False, progress=False)  # fmt: skip
    sub = Run(cfg8, r.out, r.w, r.par)
    sub.model = build_model(cfg8, r.w)
    sub.model.params[...] = r.best_params
    sub.best_params = r.best_params
    set_dropout_mode(sub.model, False)  # as the float phase leaves the model
    sub.calibrate_phase()
    sub.qat_phase(Interrupt(None), "qat")  # no handler: Ctrl-C interrupts
    test = r.w.test
    int8 = sub.qat.to_int8()
    qat_int8 = sub.q_risk(int8.forward, test)
    out: dict[str, Any] = {"ptq_int8": ptq_row(sub, lambda: build_model(cfg8, r.w))}
    out["qat_int8"] = qat_int8
    r.tick("int8_reference", t0)
    return out
