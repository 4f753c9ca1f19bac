"""nbqat's version, one definition (``nbqat.__version__``; the ONNX producer, metrics.json)."""

__version__ = "0.1.0"
