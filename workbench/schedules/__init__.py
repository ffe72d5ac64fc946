"""Training schedules as per-worker op lists (see :mod:`workbench.schedules.core`)."""
from .core import COMPUTE, KINDS, UPDATE_RULES, Op, Schedule, ScheduleError, in_flight_peak, validate

__all__ = ["COMPUTE", "KINDS", "UPDATE_RULES", "Op", "Schedule", "ScheduleError", "in_flight_peak", "validate"]
