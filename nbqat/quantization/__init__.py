"""The quantization core: fake quantization, LSQ, observers, the quantizer modules, qconfigs.

One concern per module (docs/architecture.md draws the whole tree):

* :mod:`~nbqat.quantization.fake_quant` -- torch's ``fake_quantize_*`` functions (per tensor,
  per channel, the STE mask), validated, then run on a CPU kernel or its CUDA twin;
  :mod:`~nbqat.quantization.lsq` -- the learnable-scale (LSQ) ones;
  :mod:`~nbqat.quantization.affine` and :mod:`~nbqat.quantization.float8` -- torchao's
  block-wise affine and float8 primitives.
* :mod:`~nbqat.quantization.observers` (min/max, moving average),
  :mod:`~nbqat.quantization.histogram_observers`,
  :mod:`~nbqat.quantization.range_observers` (percentile, MSE).
* :mod:`~nbqat.quantization.fake_quantize` (``FakeQuantize``),
  :mod:`~nbqat.quantization.learnable_fake_quantize` (``LearnableFakeQuantize``),
  :mod:`~nbqat.quantization.lowbit_quantize` (grouped int4, per-token, float8 modules).
* :mod:`~nbqat.quantization.qconfig` -- ``QConfig``, ``QATConfig`` and the named qconfigs.

The private modules hold what those share: the float32 min/max formulas (``_minmax_math``), one
pass of batch statistics (``_observer_stats``), argument rules (``_validate_qparams``,
``_validate_state``, ``_observer_args``), the block layouts (``_blocks``). The public names are
re-exported by :mod:`nbqat` itself; import them from there.
"""
