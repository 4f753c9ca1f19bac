"""STUB: being written; replace this whole file."""

SGD = None  # STUB
Adam = None  # STUB
AdamW = None  # STUB
