"""nbqat: quantization-aware training on NumPy and Numba, bit-exact with PyTorch.

The public API carries PyTorch's names (``torch.fake_quantize_per_tensor_affine``,
``torch.ao.quantization.MinMaxObserver``, ``torch.nn.utils.clip_grad_norm_`` ...). Functions take
NumPy arrays (run on the CPU kernels) or CUDA device arrays (run on the ``@cuda.jit`` twins);
CUDA is imported only when a CUDA array is seen. The layer graph and the TFT-like forecaster
live in :mod:`nbqat.nn`, the shipped dataset in :mod:`nbqat.data`, the main job in
:mod:`nbqat.train` (``nbqat train``) and its Python API :class:`nbqat.Forecaster`.
"""

import importlib
from typing import TYPE_CHECKING

from nbqat import _moved
from nbqat._version import __version__ as __version__
from nbqat.clip import clip_grad_norm_, clip_grad_value_, clip_grads_with_norm_, get_total_norm
from nbqat.optim import SGD, Adam, AdamW
from nbqat.quantization import affine as _affine
from nbqat.quantization import fake_quant as _fake_quant
from nbqat.quantization import float8 as _float8
from nbqat.quantization.affine import *  # noqa: F403 - block-wise affine (torchao), re-exported below
from nbqat.quantization.fake_quant import *  # noqa: F403 - its __all__, re-exported below
from nbqat.quantization.fake_quantize import FakeQuantize, LearnableFakeQuantize
from nbqat.quantization.float8 import *  # noqa: F403 - float8 (torchao), re-exported below
from nbqat.quantization.histogram_observers import HistogramObserver
from nbqat.quantization.observers import (
    MinMaxObserver,
    MovingAverageMinMaxObserver,
    MovingAveragePerChannelMinMaxObserver,
    PerChannelMinMaxObserver,
)
from nbqat.quantization.qconfig import QATConfig, QConfig, default_qat_qconfig
from nbqat.quantization.range_observers import MSEObserver, PercentileObserver

_moved.install()  # the old import paths of moved modules, with a DeprecationWarning

if TYPE_CHECKING:  # imported lazily by __getattr__
    from nbqat.forecaster import Forecaster


def __getattr__(name: str):
    """``nbqat.Forecaster``, imported on first use (``import nbqat`` stays light), and the old
    paths of moved modules (:mod:`nbqat._moved`)."""
    if name == "Forecaster":
        from nbqat.forecaster import Forecaster

        return Forecaster
    if f"nbqat.{name}" in _moved.MOVED:  # nbqat.fake_quant & co., the moved modules
        return importlib.import_module(f"nbqat.{name}")  # the alias: warns once, then cached
    raise AttributeError(f"module 'nbqat' has no attribute {name!r}")


__all__ = [
    "Adam",
    "AdamW",
    "FakeQuantize",
    "Forecaster",
    "HistogramObserver",
    "LearnableFakeQuantize",
    "MSEObserver",
    "MinMaxObserver",
    "MovingAverageMinMaxObserver",
    "MovingAveragePerChannelMinMaxObserver",
    "PerChannelMinMaxObserver",
    "PercentileObserver",
    "QATConfig",
    "QConfig",
    "SGD",
    "clip_grad_norm_",
    "clip_grad_value_",
    "clip_grads_with_norm_",
    "default_qat_qconfig",
    "get_total_norm",
]
__all__ += _fake_quant.__all__  # the fake-quantize functions, imported above
__all__ += _affine.__all__ + _float8.__all__  # torchao's low-bit primitives
