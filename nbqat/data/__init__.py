"""STUB: nbqat.data is being written."""
