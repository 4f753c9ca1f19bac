"""STUB: nbqat.nn is being written."""
