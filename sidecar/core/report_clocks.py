"""The GPUs' clock-event reasons under the throughput plot (pure): when any GPU ran slowed by heat or
power, one row of bands per reason on the plots' time axis, so a drop in steps/s can be read against
them.

A sample's reasons are taken to have held since the previous sample, as the artifact's seconds per
reason count them (:mod:`sidecar.core.gpu_health`), and as the throughput is drawn (steps/s between
two samples, at the later one): a band runs from the sample before the first that saw the reason to
the last that saw it.
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from dataclasses import dataclass, field

from sidecar.core.report_axes import BOTTOM, LEFT, RIGHT, TOP, WIDTH, duration_text

# The reasons that slow a busy GPU down, in the order drawn: (colour, kind, what it means). The
# others (gpu_idle, applications_clocks, sync_boost, display_clocks) say nothing of heat or power.
SLOWDOWN: dict[str, tuple[str, str, str]] = {
    "sw_thermal": ("#ff7f0e", "thermal", "the driver slows the clocks, the GPU or its memory too hot"),
    "hw_thermal": ("#d62728", "thermal", "the hardware halves the clocks or more, too hot"),
    "sw_power_cap": ("#9467bd", "power", "the driver holds the clocks down to stay within the power limit"),
    "hw_power_brake": ("#1f77b4", "power", "the hardware halves the clocks or more, braked from outside"),
    "hw_slowdown": ("#8c564b", "thermal or power", "the hardware halves the clocks or more"),
}
ROW = 28  # a reason's row: its label, and its bands under it
TITLE = "GPU clock-event reasons"


@dataclass
class Span:
    """A stretch of time in which some GPU reported the reason, and which GPUs did."""

    start: float
    end: float
    devices: set[str] = field(default_factory=set)


class ClockReasons:
    """Each slowdown reason's spans over the samples, fed in time order."""

    def __init__(self) -> None:
        self.read = False  # some GPU read its reasons: the run has this evidence
        self.spans: dict[str, list[Span]] = {}
        self._previous: float | None = None

    def add(self, t: float, devices: Sequence[tuple[str, Sequence[str]]]) -> None:
        """One sample's (device label, active reasons) of each GPU that read them."""
        since = t if self._previous is None else self._previous
        self._previous = t
        self.read = self.read or bool(devices)
        for label, reasons in devices:
            for reason in reasons:
                if reason not in SLOWDOWN:
                    continue
                spans = self.spans.setdefault(reason, [])
                if spans and spans[-1].end >= since:  # held since the previous sample: one span
                    spans[-1].end = t
                else:
                    spans.append(Span(since, t))
                spans[-1].devices.add(label)


def _merged(spans: Sequence[Span], pixel: float) -> list[Span]:
    """Spans closer than a pixel column joined: a reason that flaps every sample of a long soak is one
    band, not tens of thousands of rects."""
    merged: list[Span] = []
    for span in spans:
        if merged and span.start - merged[-1].end < pixel:
            merged[-1] = Span(merged[-1].start, span.end, merged[-1].devices | span.devices)
        else:
            merged.append(span)
    return merged


def _row(n: int, name: str, spans: Sequence[Span], t0: float, span: float) -> str:
    """A reason's label and its bands, each titled with its GPUs and its time from the first sample."""
    plot_w = WIDTH - LEFT - RIGHT

    def x(t: float) -> float:
        return LEFT + (t - t0) / span * plot_w

    colour, kind, _ = SLOWDOWN[name]
    y = TOP + n * ROW
    parts = [f'<text x="{LEFT + 4}" y="{y + 12}" class="legend" fill="{colour}">{name} ({kind})</text>']
    for stretch in _merged(spans, span / plot_w):
        left = x(stretch.start)
        devices = html.escape(", ".join(sorted(stretch.devices)))
        parts.append(
            f'<rect class="band" data-reason="{name}" x="{left:.1f}" y="{y + 15}" '
            f'width="{max(1.0, x(stretch.end) - left):.1f}" height="{ROW - 17}" fill="{colour}">'
            f"<title>{name} on {devices}: {duration_text(stretch.start - t0)} to "
            f"{duration_text(stretch.end - t0)}</title></rect>"
        )
    return "".join(parts)


def clock_reasons_plot(reasons: ClockReasons, t0: float, t1: float) -> str:
    """The plot of the slowdown reasons seen, one row each (a line saying none were, otherwise) on the
    time axis from ``t0`` to ``t1``, and a caption of what the drawn ones mean."""
    plot_w, span = WIDTH - LEFT - RIGHT, max(t1 - t0, 1e-9)
    drawn = [name for name in SLOWDOWN if name in reasons.spans]
    plot_h = ROW * max(1, len(drawn))
    height = TOP + plot_h + BOTTOM
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" role="img" '
        f'aria-label="{TITLE}">',
        f'<text x="{LEFT}" y="16" class="title">{TITLE} (slowdown, any GPU)</text>',
        f'<rect x="{LEFT}" y="{TOP}" width="{plot_w}" height="{plot_h}" class="frame"/>',
        f'<text x="{LEFT}" y="{height - 10}" class="axis">{duration_text(0)}</text>',
        f'<text x="{LEFT + plot_w}" y="{height - 10}" class="axis" text-anchor="end">'
        f"{duration_text(span)}</text>",
        *(_row(n, name, reasons.spans[name], t0, span) for n, name in enumerate(drawn)),
    ]
    if not drawn:
        parts.append(f'<text x="{LEFT + 10}" y="{TOP + 18}" class="axis">no GPU reported a slowdown</text>')
    meanings = "; ".join(f"{name} ({SLOWDOWN[name][1]}): {SLOWDOWN[name][2]}" for name in drawn)
    caption = (
        "Each band: some GPU reported that reason, from the sample before the first that saw it to the"
        " last that did (hover over it for its GPUs and times)"
        + (f". {meanings}" if meanings else "")
        + ". Idle and application-clock reasons are not drawn."
    )
    return "".join(parts) + f'</svg><p class="caption">{html.escape(caption)}</p>'
