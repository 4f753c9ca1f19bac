"""STUB: being written; replace this whole file."""

MinMaxObserver = None  # STUB
MovingAverageMinMaxObserver = None  # STUB
PerChannelMinMaxObserver = None  # STUB
MovingAveragePerChannelMinMaxObserver = None  # STUB
