"""STUB: being written; replace this whole file."""

QConfig = None  # STUB
QATConfig = None  # STUB
default_qat_qconfig = None  # STUB
