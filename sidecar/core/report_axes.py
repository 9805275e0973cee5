"""The time axis the report's plots share (pure): their size and margins, and a duration as the axis
labels it. One place, so a plot drawn by another module lines up with the rest on the page."""

from __future__ import annotations

from dataclasses import dataclass, field

WIDTH, HEIGHT = 900, 200
LEFT, RIGHT, TOP, BOTTOM = 70, 20, 24, 30


def duration_text(seconds: float) -> str:
    seconds = max(0, int(seconds))
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


@dataclass
class Plot:
    title: str
    unit: str
    series: dict[str, list[tuple[float, float]]] = field(default_factory=dict)
