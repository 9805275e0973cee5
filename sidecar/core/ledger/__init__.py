"""The soak as a whole (pure): where each attempt's wall time went (``phases``) and the run's
budget by cause and goodput over all its attempts (``budget``)."""
