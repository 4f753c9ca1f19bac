"""nbqat: quantization-aware training on NumPy and Numba, bit-exact with PyTorch.

The public API carries PyTorch's names (``torch.fake_quantize_per_tensor_affine``,
``torch.ao.quantization.MinMaxObserver``, ``torch.nn.utils.clip_grad_norm_`` ...). Functions take
NumPy arrays (run on the CPU kernels) or CUDA device arrays (run on the ``@cuda.jit`` twins);
CUDA is imported only when a CUDA array is seen. The layer graph and the TFT-like forecaster
live in :mod:`nbqat.nn`, the shipped dataset in :mod:`nbqat.data`, the main job in
:mod:`nbqat.train` (``nbqat train``) and its Python API :class:`nbqat.Forecaster`.
"""

from typing import TYPE_CHECKING

from nbqat import affine as _affine
from nbqat import fake_quant as _fake_quant
from nbqat import float8 as _float8
from nbqat.affine import *  # noqa: F403 - block-wise affine (torchao), re-exported below
from nbqat.clip import clip_grad_norm_, clip_grad_value_, clip_grads_with_norm_, get_total_norm
from nbqat.fake_quant import *  # noqa: F403 - its __all__, re-exported below
from nbqat.fake_quantize import FakeQuantize, LearnableFakeQuantize
from nbqat.float8 import *  # noqa: F403 - float8 (torchao), re-exported below
from nbqat.histogram_observers import HistogramObserver
from nbqat.observers import (
    MinMaxObserver,
    MovingAverageMinMaxObserver,
    MovingAveragePerChannelMinMaxObserver,
    PerChannelMinMaxObserver,
)
from nbqat.optim import SGD, Adam, AdamW
from nbqat.qconfig import QATConfig, QConfig, default_qat_qconfig
from nbqat.range_observers import MSEObserver, PercentileObserver

if TYPE_CHECKING:  # imported lazily by __getattr__
    from nbqat.forecaster import Forecaster

__version__ = "0.1.0"


def __getattr__(name: str):
    """``nbqat.Forecaster``, imported on first use (``import nbqat`` stays light)."""
    if name == "Forecaster":
        from nbqat.forecaster import Forecaster

        return Forecaster
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
