"""FakeQuantize constructor arguments shared by the quantizer tests.

Spelled as torch spells them: the same dict less ``observer`` (and with torch's dtype and
qscheme objects) builds torch's module around torch's observer class of the same name.
"""

from __future__ import annotations

from typing import Any

import nbqat


def per_channel_kwargs(ch_axis: int = 0, **overrides: Any) -> dict[str, Any]:
    """FakeQuantize arguments of per-channel symmetric qint8 weights along ``ch_axis``.

    Parameters
    ----------
    ch_axis : int, default 0
        The channel axis.
    **overrides
        Arguments that replace or add to these.

    Returns
    -------
    dict
        ``MovingAveragePerChannelMinMaxObserver``, ``[-128, 127]``, ``"qint8"``,
        ``"per_channel_symmetric"``, ``ch_axis`` (torch's per-channel weight fake quant).
    """
    kw: dict[str, Any] = dict(
        observer=nbqat.MovingAveragePerChannelMinMaxObserver,
        quant_min=-128,
        quant_max=127,
        dtype="qint8",
        qscheme="per_channel_symmetric",
        ch_axis=ch_axis,
    )
    return kw | overrides
