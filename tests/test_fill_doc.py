"""nbqat._docs.fill_doc: shared numpydoc blocks land complete, at the placeholder's indentation."""

from __future__ import annotations

import inspect

import pytest

from nbqat._docs import BACKWARD_IO, FORECAST_IO, fill_doc


def test_block_is_indented_like_its_placeholder() -> None:
    @fill_doc(io="a : int\n    The a.\n\nb : float")
    def f(a: int, b: float) -> None:
        """Summary.

        Parameters
        ----------
        {io}
        """

    expected = "Summary.\n\nParameters\n----------\na : int\n    The a.\n\nb : float"
    assert inspect.cleandoc(f.__doc__ or "") == expected
    assert "\n        a : int\n            The a.\n\n        b : float\n" in (f.__doc__ or "")


def test_unknown_placeholder_and_unused_block_are_refused() -> None:
    def g() -> None:
        """Summary.

        {missing}
        """

    with pytest.raises(ValueError, match="missing"):
        fill_doc(other="x")(g)
    with pytest.raises(ValueError, match="not used"):
        fill_doc(missing="x", spare="y")(g)


def test_no_docstring_is_left_alone() -> None:
    def h() -> None:
        pass

    assert fill_doc(x="y")(h) is h and h.__doc__ is None


def test_forecaster_docstrings_are_complete_at_run_time() -> None:
    from nbqat.nn import LSTMForecaster, QATTemporalFusionTransformer, TemporalFusionTransformer
    from nbqat.nn.int8 import Int8TemporalFusionTransformer

    for meth in (
        QATTemporalFusionTransformer.forward,
        QATTemporalFusionTransformer.predict,
        Int8TemporalFusionTransformer.forward,
        LSTMForecaster.forward,
    ):
        doc = meth.__doc__ or ""
        assert "{forecast_io}" not in doc and "{cast}" not in doc, meth
        assert "historical : ndarray (B, input_length, num_unknown_features)" in doc
    for meth in (QATTemporalFusionTransformer.backward, TemporalFusionTransformer.backward):
        doc = meth.__doc__ or ""
        assert "{backward_io}" not in doc and "dfuture : ndarray" in doc
    assert "{cast}" in FORECAST_IO and "{cast}" in BACKWARD_IO
