"""The final replay-ingress invariants of a completed run, in a fixed order (first failure)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sidecar.core.run_summary.contract import (
    REPLAY_INGRESS_INTEGER_FIELDS,
    finite_number,
    integer,
    mapping,
    show,
)


def replay_ingress_failure(summary: Mapping[str, Any]) -> str | None:
    """The final replay-ingress invariants of a completed run (fixed order, first failure)."""
    manifest = mapping(summary.get("runtime_manifest"))
    if manifest is None:
        return "completed runtime_manifest is missing runtime_manifest"
    replay_ingress = mapping(manifest.get("replay_ingress"))
    if replay_ingress is None:
        return "completed runtime_manifest is missing replay_ingress"
    values = _ingress_values(replay_ingress)
    if isinstance(values, str):
        return values
    return (
        _ingress_sequence_failure(values)
        or _ingress_occupancy_failure(values)
        or _ingress_returns_failure(values)
        or _ingress_totals_failure(values, summary.get("total_env_steps"))
    )


def _ingress_values(replay_ingress: Mapping[str, Any]) -> dict[str, int] | str:
    """The integer fields, all nonnegative, once backpressure_wait_s is valid; else the failure."""
    values: dict[str, int] = {}
    for name in REPLAY_INGRESS_INTEGER_FIELDS:
        raw = replay_ingress.get(name)
        number = integer(raw)
        if number is None:
            return f"replay_ingress.{name} must be an integer, got {show(raw)}"
        values[name] = number
    wait_s = replay_ingress.get("backpressure_wait_s")
    finite_wait_s = finite_number(wait_s)
    if finite_wait_s is None:
        return f"replay_ingress.backpressure_wait_s must be finite, got {show(wait_s)}"
    if finite_wait_s < 0:
        return f"replay_ingress.backpressure_wait_s must be nonnegative, got {finite_wait_s!r}"
    for name in REPLAY_INGRESS_INTEGER_FIELDS:
        if values[name] < 0:
            return f"replay_ingress.{name} must be nonnegative, got {values[name]}"
    return values


def _ingress_sequence_failure(values: Mapping[str, int]) -> str | None:
    depth = values["ingress_depth"]
    slot_rows = values["ingress_slot_rows"]
    published = values["published_sequence"]
    released = values["release_sequence"]
    occupancy = values["occupancy"]
    if depth <= 0:
        return f"replay_ingress.ingress_depth must be positive, got {depth}"
    if slot_rows <= 0:
        return f"replay_ingress.ingress_slot_rows must be positive, got {slot_rows}"
    if released > published:
        return f"replay_ingress release_sequence exceeds published_sequence: {released} > {published}"
    if occupancy != published - released:
        return (
            "replay_ingress occupancy does not match publication sequences: "
            f"{occupancy} != {published - released}"
        )
    return None


def _ingress_occupancy_failure(values: Mapping[str, int]) -> str | None:
    depth = values["ingress_depth"]
    occupancy = values["occupancy"]
    high_water = values["high_water_occupancy"]
    if occupancy > depth:
        return f"replay_ingress occupancy exceeds ingress_depth: {occupancy} > {depth}"
    if high_water > depth:
        return f"replay_ingress high_water_occupancy exceeds ingress_depth: {high_water} > {depth}"
    if high_water < occupancy:
        return f"replay_ingress high_water_occupancy is below final occupancy: {high_water} < {occupancy}"
    return None


def _ingress_returns_failure(values: Mapping[str, int]) -> str | None:
    early = values["early_returns"]
    dropped = values["dropped_batches"]
    if early != dropped:
        return f"replay_ingress early_returns and dropped_batches disagree: {early} != {dropped}"
    if values["closed_returns"] + values["stop_returns"] != early:
        return (
            "replay_ingress shutdown return counters disagree with early_returns: "
            f"{values['closed_returns']} + {values['stop_returns']} != {early}"
        )
    if values["occupancy"] != 0:
        return f"final replay ingress occupancy is nonzero: {values['occupancy']}"
    if dropped != 0:
        return f"replay ingress dropped batches during normal run: {dropped}"
    # No separate "early returns during normal run" check: early_returns equals
    # dropped_batches, which is 0 here, so it could never fire.
    return None


def _ingress_totals_failure(values: Mapping[str, int], total_env_steps: object) -> str | None:
    slot_rows = values["ingress_slot_rows"]
    published = values["published_sequence"]
    total_steps = integer(total_env_steps)
    if total_steps is None:
        return f"completed total_env_steps must be an integer, got {show(total_env_steps)}"
    if total_steps <= 0:
        return f"completed total_env_steps must be positive, got {total_steps}"
    if total_steps % slot_rows != 0:
        return (
            "total_env_steps is not divisible by replay_ingress.ingress_slot_rows: "
            f"{total_steps} % {slot_rows}"
        )
    expected_sequence = total_steps // slot_rows
    if published != expected_sequence:
        return (
            "replay_ingress published_sequence does not match total_env_steps: "
            f"{published} != {expected_sequence}"
        )
    # No release_sequence counterpart of this check: occupancy = published - released = 0
    # was enforced above, so released equals published here and it could never fire.
    if values["high_water_occupancy"] <= 0:
        return "completed replay_ingress high_water_occupancy must be positive"
    return None
