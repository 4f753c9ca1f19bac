"""Training-mode dropout (issue 32): one main-job step's dropout layers, nbqat vs NumPy and torch.

A float step of the default ``nbqat train`` runs 33 dropout layers (TFTConfig.dropout 0.1 at
every GLU input): 11 of (64, 16), 5 of (64, 24, 16), 15 of (1536, 16) and 2 of (64, 48, 16).
Three implementations of that set, each timed as the median of ``REPEAT`` passes:

* nbqat's :class:`~nbqat.nn.Dropout` (one compiled pass: NumPy's SeedSequence + PCG64 stream,
  the mask and ``x * mask``);
* the same masks with NumPy (``default_rng(seed).random(shape) >= p``, the cast, the scale and
  the product: what nbqat computed before; its output is checked equal, bit for bit);
* ``torch.nn.functional.dropout`` (another random stream; for the speed only), one thread.

Also the copy roof of the bytes a layer must move (read ``x``, write ``y`` and the mask: 12 per
element). Ratios are reported, never asserted. ``NBQAT_BENCH_SMALL=1`` runs one layer of each.
"""

from __future__ import annotations

import numpy as np
from _roof import copy_roof, median_time, ours_time, report, torch_or_none
from conftest import SMALL

from nbqat.nn import Dropout

SHAPES = {(64, 16): 11, (64, 24, 16): 5, (1536, 16): 15, (64, 48, 16): 2}
if SMALL:
    SHAPES = {s: 1 for s in SHAPES}
P = 0.1
REPEAT = 3 if SMALL else 15


def _layers():
    rng = np.random.default_rng(0)
    out = []
    for stream, shape in enumerate(s for s, n in SHAPES.items() for _ in range(n)):
        d = Dropout(P)
        d.training, d.seed, d.stream = True, (0, 1, 7), stream
        out.append((d, rng.normal(size=shape).astype(np.float32)))
    return out


def _numpy_dropout(x, seed):
    keep = np.random.default_rng(seed).random(x.shape, dtype=np.float32) >= np.float32(P)
    return x * (keep.astype(np.float32) * (np.float32(1) / (np.float32(1) - np.float32(P))))


def test_dropout_step_layers(benchmark):
    layers = _layers()
    for d, x in layers:  # the same bits as NumPy's masks
        np.testing.assert_array_equal(d.forward(x), _numpy_dropout(x, [*d.seed, d.stream]))

    def ours():
        for d, x in layers:
            d.forward(x)

    def numpy_path():
        for d, x in layers:
            _numpy_dropout(x, [*d.seed, d.stream])

    t_ours = ours_time(benchmark, ours, REPEAT)
    elems = sum(x.size for _, x in layers)
    figures = {"layers": len(layers), "elements": elems, "ms": t_ours * 1e3}
    figures["numpy_ms"] = median_time(numpy_path, REPEAT) * 1e3
    figures["speedup_vs_numpy"] = figures["numpy_ms"] / figures["ms"]
    figures["fraction_of_roof"] = copy_roof(12 * elems, repeat=REPEAT) / t_ours
    torch = torch_or_none()
    if torch is not None:
        old = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            tx = [torch.from_numpy(x) for _, x in layers]

            def torch_path():
                for x in tx:
                    torch.nn.functional.dropout(x, P, training=True)

            figures["torch_ms"] = median_time(torch_path, REPEAT) * 1e3
        finally:
            torch.set_num_threads(old)
        figures["speedup_vs_torch"] = figures["torch_ms"] / figures["ms"]
    report(benchmark, **figures)
