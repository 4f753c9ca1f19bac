"""STUB: being written; replace this whole file."""

FakeQuantize = None  # STUB
LearnableFakeQuantize = None  # STUB
