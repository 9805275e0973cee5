"""The soak report (pure): one self-contained HTML page from an artifact and its samples.

Inline SVG plots, no script and nothing fetched: it opens anywhere, offline. Each series is drawn
from every sample, thinned per pixel column to its minimum and maximum, so a spike one sample wide
still shows and a 72-hour soak at 5 s stays a small page. Plots mark when the soft stop, the first
TERM and the first KILL went to the trainer (and the stall or the deadline that caused them). It
draws what :mod:`sidecar.core.report_input` parsed: text, and finite numbers within its bounds.
"""

from __future__ import annotations

import html
import math
import re
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from sidecar.core.classification import STALLED
from sidecar.core.report_axes import BOTTOM, HEIGHT, LEFT, RIGHT, TOP, WIDTH, Plot, duration_text
from sidecar.core.report_clocks import ClockReasons, clock_reasons_plot
from sidecar.core.report_input import STOP_LABELS, ReportArtifact, Stacks, TrainerEnd, Trend
from sidecar.core.report_notes import integrity_notes, partial_note
from sidecar.core.report_progress import THROUGHPUT, ProgressPlots
from sidecar.core.report_samples import ReportSample

COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf")
MIB = 1024.0


def _plots(
    artifact: ReportArtifact, samples: Iterable[ReportSample], clocks: ClockReasons
) -> tuple[list[Plot], float, float]:
    """The plots of every sample, the GPUs' clock-event reasons fed to ``clocks``; returns them with
    the first and last sample times (wall clock)."""
    rss, fds = Plot("Process tree resident memory", "MiB"), Plot("Open file descriptors by class", "fds")
    procs, gpu = Plot("Processes", "count"), Plot("GPU memory per device", "MiB")
    progress, budget = Plot("Progress written", "bytes"), Plot("Budget left", "s")
    progress_records = ProgressPlots()
    end = artifact.deadline_unix
    # Plain appends per sample (a long soak has tens of thousands).
    rss_line = rss.series.setdefault("RSS", [])
    proc_line, zombie_line = procs.series.setdefault("processes", []), procs.series.setdefault("zombies", [])
    progress_line, budget_line = progress.series.setdefault("bytes", []), budget.series.setdefault("left", [])
    first = last = math.nan
    for sample in samples:
        t = sample.t_wall
        if first != first:  # noqa: PLR0124 - NaN until the first sample
            first = t
        last = t
        rss_line.append((t, sample.rss_kib / MIB))
        for fd_class, count in sample.fd_classes:
            fds.series.setdefault(fd_class, []).append((t, count))
        proc_line.append((t, sample.processes))
        zombie_line.append((t, sample.zombies))
        for device, used in sample.gpu_used_mib:
            gpu.series.setdefault(device, []).append((t, used))
        progress_line.append((t, sample.progress_bytes))
        clocks.add(t, sample.clock_reasons)
        progress_records.add(t, sample)
        if end is not None:
            budget_line.append((t, max(0.0, end - t)))
    plots = [rss, fds, procs, gpu, progress, budget]
    plots += progress_records.plots()
    for plot in plots:
        plot.series = {name: points for name, points in sorted(plot.series.items()) if points}
    return plots, first, last


def _thin(
    points: Sequence[tuple[float, float]], t0: float, span: float, columns: int
) -> list[tuple[float, float]]:
    """At most the first, minimum, maximum and last point of each pixel column, in time order (the
    points come in time order, so one pass keeps one column's four at a time)."""
    kept: list[tuple[float, float]] = []
    scale = columns / span if span > 0 else 0.0
    current = -1
    first = low = high = last = (0.0, 0.0)
    for point in points:
        value = point[1]
        column = min(columns - 1, int((point[0] - t0) * scale))
        if column != current:
            if current >= 0:
                kept.extend(sorted({first, low, high, last}))
            current, first, low, high = column, point, point, point
        elif value < low[1]:
            low = point
        elif value > high[1]:
            high = point
        last = point
    if current >= 0:
        kept.extend(sorted({first, low, high, last}))
    return kept


def _fmt(value: float) -> str:
    if abs(value) >= 1e6 or (0 < abs(value) < 1e-2):
        return f"{value:.3g}"
    return f"{value:,.1f}" if value != int(value) else f"{int(value):,}"


def _size(value: float, unit: str) -> str:
    """A figure in its unit, bytes and MiB with a binary prefix (28.1 GiB, not 3.02e+10 bytes)."""
    scale = {"bytes": 1.0, "KiB": 1024.0, "MiB": 1024.0**2}.get(unit)
    if scale is None:
        return f"{_fmt(value)} {unit}"
    size, prefixes = abs(value) * scale, ["bytes", "KiB", "MiB", "GiB", "TiB"]
    while size >= 1024.0 and len(prefixes) > 1:
        size /= 1024.0
        prefixes.pop(0)
    return f"{'-' if value < 0 else ''}{size:.3g} {prefixes[0]}"


def _trend_row(trend: Trend, passed: bool) -> list[Any]:
    grows = trend.low_per_hour > 0
    note = ""
    if grows:
        # The whole interval above zero: steady growth, which the opt-in leak rules
        # (SOAK_MONITOR__MAX_RSS_GROWTH_MIB, ..._MAX_FD_GROWTH, ..._FAIL_ON_PROJECTED_MEMORY_LIMIT) fail.
        note = "grows steadily (the whole 95 % interval is above zero)"
        note += ": a leak rule would have failed it" if passed else ""
    return [
        trend.series,
        f"{_size(trend.per_hour, trend.unit)} per hour",
        _size(trend.low_per_hour, trend.unit),
        _size(trend.high_per_hour, trend.unit),
        trend.points,
        note,
    ]


def _gpu_trends_section(trends: Sequence[Trend]) -> list[str]:
    """Per-GPU degradation trends; a correctable error count whose whole interval is above zero is
    flagged (SOAK_GPU__FAIL_ON_CORRECTABLE_GROWTH fails it)."""
    if not trends:
        return []
    rows = [
        [
            t.series,
            f"{_fmt(t.per_hour)} {t.unit} per hour",
            _fmt(t.low_per_hour),
            _fmt(t.high_per_hour),
            t.points,
            "grows steadily" if t.low_per_hour > 0 else "",
        ]
        for t in trends
    ]
    return [
        "<h2>GPU degradation trends (Theil-Sen, per hour, 95 % interval)</h2>",
        html_table(["series", "per hour", "low", "high", "points", "note"], rows),
    ]


def _gpu_left_section(findings: Sequence[str]) -> list[str]:
    if not findings:
        return []
    return ["<h2>What the run left on its GPUs</h2>", html_table(["finding"], [[f] for f in findings])]


def describe_end(end: TrainerEnd | None) -> str:
    """How the trainer ended, in words."""
    if end is None:
        return "unknown (no exit record from the launcher)"
    if end.signal_name is not None:
        how = f"killed by {end.signal_name}"
    elif end.returncode is not None:
        how = f"exited with code {end.returncode}"
    else:
        how = "never started"
    return how if end.reason == "exited" else f"{how} ({end.reason.replace('_', ' ')})"


# How much of the console's end the report shows.
CONSOLE_TAIL_BYTES = 8192
CONSOLE_TAIL_LINES = 40
_CONTROL = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|[\x00-\x08\x0b-\x1f\x7f]")


def console_tail(data: bytes, *, cut: bool) -> str:
    """The last lines of the console's last bytes, terminal escapes and control characters removed;
    ``cut``: the bytes start mid-file, so their first line is partial and dropped."""
    lines = data.decode("utf-8", errors="replace").splitlines()
    if cut and lines:
        lines = lines[1:]
    return _CONTROL.sub("", "\n".join(lines[-CONSOLE_TAIL_LINES:]))


def _span(artifact: ReportArtifact, first: float, last: float) -> float:
    """The time axis runs to the last event: the last sample, a stop, the trainer's end, and the
    deadline when the run reached it."""
    events = [last, *(t for _, t in artifact.stop_times)]
    end = artifact.trainer_end
    if end is not None and end.ended_unix is not None:
        events.append(end.ended_unix)
    reached = max(events)
    if artifact.deadline_unix is not None and artifact.deadline_unix <= reached + 1.0:
        reached = max(reached, artifact.deadline_unix)
    return max(reached, first + 1e-9)


def _svg(plot: Plot, t0: float, t1: float, marks: Sequence[tuple[float, str]]) -> str:
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
    span = max(t1 - t0, 1e-9)
    values = [v for points in plot.series.values() for _, v in points]
    low, high = (min(values), max(values)) if values else (0.0, 1.0)
    low = min(low, 0.0)
    high = high if high > low else low + 1.0

    def x(t: float) -> float:
        return LEFT + (t - t0) / span * plot_w

    def y(v: float) -> float:
        return TOP + plot_h - (v - low) / (high - low) * plot_h

    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" role="img" '
        f'aria-label="{html.escape(plot.title)}">',
        f'<text x="{LEFT}" y="16" class="title">{html.escape(plot.title)} ({html.escape(plot.unit)})</text>',
        f'<rect x="{LEFT}" y="{TOP}" width="{plot_w}" height="{plot_h}" class="frame"/>',
        f'<text x="{LEFT - 6}" y="{TOP + 10}" class="axis" text-anchor="end">{_fmt(high)}</text>',
        f'<text x="{LEFT - 6}" y="{TOP + plot_h}" class="axis" text-anchor="end">{_fmt(low)}</text>',
        f'<text x="{LEFT}" y="{HEIGHT - 10}" class="axis">{duration_text(0)}</text>',
        f'<text x="{LEFT + plot_w}" y="{HEIGHT - 10}" class="axis" text-anchor="end">'
        f"{duration_text(span)}</text>",
    ]
    for t, label in marks:
        if t0 <= t <= t1:
            parts.append(
                f'<line x1="{x(t):.1f}" x2="{x(t):.1f}" y1="{TOP}" y2="{TOP + plot_h}" class="mark"/>'
                f'<text x="{x(t) + 3:.1f}" y="{TOP + 12}" class="mark-label">{html.escape(label)}</text>'
            )
    for n, (name, points) in enumerate(plot.series.items()):
        color = COLORS[n % len(COLORS)]
        drawn = _thin(points, t0, span, plot_w)
        d = " ".join(f"{'M' if i == 0 else 'L'}{x(t):.1f} {y(v):.1f}" for i, (t, v) in enumerate(drawn))
        parts.append(
            f'<path class="series" data-series="{html.escape(name)}" d="{d}" stroke="{color}" fill="none"/>'
            f'<text x="{LEFT + 90 + 150 * n}" y="{TOP + plot_h + 16}" class="legend" fill="{color}">'
            f"{html.escape(name)}</text>"
        )
    if not plot.series:
        parts.append(f'<text x="{LEFT + 10}" y="{TOP + plot_h / 2}" class="axis">no data</text>')
    parts.append("</svg>")
    return "".join(parts)


def _marks(artifact: ReportArtifact) -> list[tuple[float, str]]:
    marks = [(t, STOP_LABELS[name]) for name, t in artifact.stop_times]
    end = artifact.trainer_end
    if end is not None and end.ended_unix is not None:
        marks.append((end.ended_unix, "ended"))
    cause = artifact.classification
    if marks and cause in STALLED:
        t = min(marks)[0]
        marks.append((t, f"stall ({cause})"))
    if artifact.deadline_unix is not None:
        marks.append((artifact.deadline_unix, "deadline"))
    return sorted(marks)


def html_table(headers: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in headers)
    body = "".join(
        "<tr>" + "".join(f"<td>{html.escape('' if c is None else str(c))}</td>" for c in row) + "</tr>"
        for row in rows
    )
    return f"<table><tr>{head}</tr>{body}</table>" if body else "<p>none</p>"


STYLE = (
    "body{font-family:sans-serif;margin:24px;color:#222}h1{font-size:20px}h2{font-size:16px;margin-top:28px}"
    ".passed{color:#2ca02c}.failed{color:#d62728}.running,.stopping,.partial{color:#ff7f0e}"
    "svg{display:block;margin:8px 0}.title{font-size:13px;"
    "font-weight:bold}.axis,.legend,.mark-label{font-size:11px}.frame{fill:none;stroke:#bbb}"
    ".mark{stroke:#555;stroke-dasharray:4 3}.series{stroke-width:1.4}table{border-collapse:collapse;"
    "font-size:12px}td,th{border:1px solid #ddd;padding:3px 8px;text-align:left;vertical-align:top}"
    ".caption{font-size:12px;margin-top:0}pre{font-size:11px;background:#f6f6f6;padding:8px;overflow-x:auto;white-space:pre-wrap}"
)


def _stacks_section(stacks: Stacks | None) -> list[str]:
    """Where the trainer's processes were when the stall stopped them (py-spy, via the launcher)."""
    if stacks is None:
        return []
    section = ["<h2>Python stacks at the stall</h2>"]
    if stacks.missing is not None:
        section.append(f"<p>none: {html.escape(stacks.missing)}</p>")
    for process in stacks.processes:
        section.append(f"<p>pid {process.pid}: <code>{html.escape(process.command or '-')}</code></p>")
        if process.stack is not None:
            section.append(f"<pre>{html.escape(process.stack)}</pre>")
        else:
            section.append(f"<p>no stack: {html.escape(process.missing or 'not read')}</p>")
    return section


def _time_spent(artifact: ReportArtifact) -> list[str]:
    """Where the attempt's time went, phase by phase."""
    if not artifact.phases:
        return []
    total = sum(seconds for _, _, seconds in artifact.phases) or 1.0
    rows = [
        [kind.replace("_", " "), duration_text(seconds), f"{seconds / total:.0%}"]
        for kind, _, seconds in artifact.phases
    ]
    note = f"<p>{html.escape(artifact.checkpoint_note)}</p>" if artifact.checkpoint_note else ""
    return ["<h2>Where the time went</h2>", html_table(["phase", "time", "share"], rows), note]


def _over_time(artifact: ReportArtifact, samples: Iterable[ReportSample]) -> list[str]:
    """The plots of the samples on the run's time axis, or why there are none."""
    clocks = ClockReasons()
    plots, t0, last = _plots(artifact, samples, clocks)
    if artifact.samples_file is None:
        return ["<p>no samples: the trainer never ran in this attempt (the reason is above)</p>"]
    if math.isnan(t0):
        return ["<p>no samples</p>"]
    t1, marks = _span(artifact, t0, last), _marks(artifact)
    drawn: list[str] = []
    for plot in plots:
        drawn.append(_svg(plot, t0, t1, marks))
        # Right under the throughput, whether heat or power slowed the GPUs meanwhile.
        if plot.title == THROUGHPUT and clocks.read:
            drawn.append(clock_reasons_plot(clocks, t0, t1))
    return drawn


def render_report(
    artifact: ReportArtifact,
    samples: Iterable[ReportSample],
    console_tail: str | None = None,
    mismatched: Callable[[], Sequence[str]] = tuple,
) -> str:
    """The report page of one attempt; ``console_tail``: the last lines of the trainer's console;
    ``mismatched``: asked once the samples are read, evidence that differs from its record."""
    over_time = _over_time(artifact, samples)
    status = artifact.status
    body = [
        f"<h1>soak {html.escape(artifact.run_id)}: "
        f'<span class="{html.escape(status)}">{html.escape(status.upper())}</span></h1>',
        html_table(
            ["classification", "exit code", "reason", "trainer", "started", "duration"],
            [
                [
                    artifact.classification or "-",
                    artifact.exit_code,
                    artifact.reason or "-",
                    describe_end(artifact.trainer_end),
                    artifact.started_at,
                    duration_text(artifact.duration_s),
                ]
            ],
        ),
        f"<p>command: <code>{html.escape(' '.join(artifact.command) or '-')}</code></p>",
        *partial_note(artifact),
        *integrity_notes(artifact, mismatched()),
        *(f"<p>{html.escape(line)}</p>" for line in artifact.lost_attempts),
        *_time_spent(artifact),
        "<h2>Over time</h2>",
        *over_time,
        "<h2>Leak trends (Theil-Sen, per hour, 95 % interval)</h2>",
        html_table(
            ["series", "per hour", "low", "high", "points", "note"],
            [_trend_row(t, status == "passed") for t in artifact.trends],
        ),
        *_gpu_trends_section(artifact.gpu_trends),
        *_gpu_left_section(artifact.gpu_left),
        "<h2>Processes left after the trainer ended</h2>",
        html_table(["pid", "fate", "command"], [[p.pid, p.fate, p.command] for p in artifact.residuals]),
        "<h2>Run summary figures</h2>",
        html_table(["figure", "value"], artifact.figures),
        *_stacks_section(artifact.stacks),
        "<h2>Console (last lines)</h2>",
        f"<pre>{html.escape(console_tail)}</pre>" if console_tail else "<p>none kept</p>",
    ]
    title = html.escape(f"soak report {artifact.run_id}")
    return (
        f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>{title}</title>'
        f"<style>{STYLE}</style></head><body>{''.join(body)}</body></html>\n"
    )
