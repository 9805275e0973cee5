"""What every settings group shares: bounds that refuse absurd values, and the group base."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

# Bounds that refuse absurd values (1e308 s, 1e-300 s) while allowing any real soak: a year of
# budget, a day for any grace, timeout or interval, 10 ms the shortest interval.
MIN_INTERVAL_S = 0.01
DAY_S = 86_400.0
MAX_SECONDS = 366 * DAY_S
MAX_BYTES = 1024**4
MAX_MIB = 1024.0**3


class Group(BaseModel):
    # Non-finite numbers are refused with their own message ("should be a finite number").
    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)
