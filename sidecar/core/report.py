"""The soak report (pure): one self-contained HTML page from an artifact and its samples.

Inline SVG plots, no script and nothing fetched: it opens anywhere, offline. Each series is drawn
from every sample, thinned per pixel column to its minimum and maximum, so a spike one sample wide
still shows and a 72-hour soak at 5 s stays a small page. Plots mark when the soft stop, the first
TERM and the first KILL went to the trainer (and the stall or the deadline that caused them).
"""

from __future__ import annotations

import html
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

WIDTH, HEIGHT = 900, 200
LEFT, RIGHT, TOP, BOTTOM = 70, 20, 24, 30
COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf")
MARKS = {"soft_stop": "soft stop", "term": "TERM", "kill": "KILL"}
MIB = 1024.0


@dataclass
class Plot:
    title: str
    unit: str
    series: dict[str, list[tuple[float, float]]] = field(default_factory=dict)

    def add(self, name: str, t: float, value: float | None) -> None:
        if value is not None and math.isfinite(value):
            self.series.setdefault(name, []).append((t, value))


def _plots(
    artifact: Mapping[str, Any], samples: Iterable[Mapping[str, Any]]
) -> tuple[list[Plot], float, float]:
    """The plots of every sample; returns them with the first and last sample times (wall clock)."""
    rss, fds = Plot("Process tree resident memory", "MiB"), Plot("Open file descriptors by class", "fds")
    procs, gpu = Plot("Processes", "count"), Plot("GPU memory per device", "MiB")
    progress, budget = Plot("Progress written", "bytes"), Plot("Budget left", "s")
    deadline = (artifact.get("deadline") or {}).get("deadline_unix")
    end = float(deadline) if isinstance(deadline, (int, float)) else None
    # Plain appends per sample (a long soak has tens of thousands); non-finite values go in _thin.
    rss_line = rss.series.setdefault("RSS", [])
    proc_line, zombie_line = procs.series.setdefault("processes", []), procs.series.setdefault("zombies", [])
    progress_line, budget_line = progress.series.setdefault("bytes", []), budget.series.setdefault("left", [])
    first = last = math.nan
    for sample in samples:
        t = float(sample["t_wall"])
        if first != first:  # noqa: PLR0124 - NaN until the first sample
            first = t
        last = t
        tree = sample.get("process") or {}
        rss_line.append((t, tree.get("rss_kib_total", 0) / MIB))
        for fd_class, count in (tree.get("fd_classes_total") or {}).items():
            fds.series.setdefault(fd_class, []).append((t, count))
        proc_line.append((t, tree.get("process_count", 0)))
        zombie_line.append((t, tree.get("zombie_count", 0)))
        for device in (sample.get("gpu") or {}).get("devices") or ():
            used = device.get("memory_used_mib")
            if used is not None:
                gpu.series.setdefault(
                    f"GPU {device.get('index')} {str(device.get('uuid', ''))[:12]}", []
                ).append((t, used))
        progress_line.append((t, (sample.get("progress") or {}).get("bytes_total", 0)))
        if end is not None:
            budget_line.append((t, max(0.0, end - t)))
    for plot in (rss, fds, procs, gpu, progress, budget):
        plot.series = {name: points for name, points in sorted(plot.series.items()) if points}
    return [rss, fds, procs, gpu, progress, budget], first, last


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
        if not math.isfinite(value):
            continue
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


def _clock(seconds: float) -> str:
    seconds = max(0, int(seconds))
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


def _svg(plot: Plot, t0: float, t1: float, marks: Sequence[tuple[float, str]]) -> str:
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
    span = max(t1 - t0, 1e-9)
    values = [v for points in plot.series.values() for _, v in points if math.isfinite(v)]
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
        f'<text x="{LEFT}" y="{HEIGHT - 10}" class="axis">{_clock(0)}</text>',
        f'<text x="{LEFT + plot_w}" y="{HEIGHT - 10}" class="axis" text-anchor="end">{_clock(span)}</text>',
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


def _marks(artifact: Mapping[str, Any]) -> list[tuple[float, str]]:
    launcher = (artifact.get("post_shutdown") or {}).get("launcher_exit") or {}
    times = launcher.get("stop_times_unix") or {}
    marks = [
        (float(t), MARKS[name]) for name, t in times.items() if name in MARKS and isinstance(t, (int, float))
    ]
    cause = artifact.get("failure_classification")
    if marks and cause in ("timeout/stale_tick", "timeout/startup"):
        t = min(marks)[0]
        marks.append((t, f"stall ({cause})"))
    deadline = (artifact.get("deadline") or {}).get("deadline_unix")
    if isinstance(deadline, (int, float)):
        marks.append((float(deadline), "deadline"))
    return sorted(marks)


def _table(headers: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in headers)
    body = "".join(
        "<tr>" + "".join(f"<td>{html.escape('' if c is None else str(c))}</td>" for c in row) + "</tr>"
        for row in rows
    )
    return f"<table><tr>{head}</tr>{body}</table>" if body else "<p>none</p>"


STYLE = (
    "body{font-family:sans-serif;margin:24px;color:#222}h1{font-size:20px}h2{font-size:16px;margin-top:28px}"
    ".passed{color:#2ca02c}.failed{color:#d62728}svg{display:block;margin:8px 0}.title{font-size:13px;"
    "font-weight:bold}.axis,.legend,.mark-label{font-size:11px}.frame{fill:none;stroke:#bbb}"
    ".mark{stroke:#555;stroke-dasharray:4 3}.series{stroke-width:1.4}table{border-collapse:collapse;"
    "font-size:12px}td,th{border:1px solid #ddd;padding:3px 8px;text-align:left;vertical-align:top}"
)


def render_report(artifact: Mapping[str, Any], samples: Iterable[Mapping[str, Any]]) -> str:
    """The report page of one attempt."""
    plots, t0, t1 = _plots(artifact, samples)
    status = str(artifact.get("status", "unknown"))
    context = artifact.get("context") or {}
    summary = artifact.get("resource_summary") or {}
    marks = _marks(artifact)
    body = [
        f"<h1>soak {html.escape(str(context.get('run_id', '')))}: "
        f'<span class="{html.escape(status)}">{html.escape(status.upper())}</span></h1>',
        _table(
            ["classification", "exit code", "reason", "started", "duration"],
            [
                [
                    artifact.get("failure_classification") or "-",
                    artifact.get("exit_code"),
                    artifact.get("failure_reason") or "-",
                    artifact.get("started_at_utc"),
                    _clock(float(artifact.get("duration_s") or 0)),
                ]
            ],
        ),
        "<h2>Over time</h2>",
    ]
    if math.isnan(t0):
        body.append("<p>no samples</p>")
    else:
        body.extend(_svg(plot, t0, max(t1, t0 + 1e-9), marks) for plot in plots)
    body += [
        "<h2>Leak trends (Theil-Sen, per hour, 95 % interval)</h2>",
        _table(
            ["series", "unit", "per hour", "low", "high", "points"],
            [
                [
                    t["series"],
                    t["unit"],
                    _fmt(t["per_hour"]),
                    _fmt(t["low_per_hour"]),
                    _fmt(t["high_per_hour"]),
                    t["points"],
                ]
                for t in summary.get("trends") or []
            ],
        ),
        "<h2>Processes left after the trainer ended</h2>",
        _table(
            ["pid", "fate", "command"],
            [
                [p.get("pid"), p.get("fate"), p.get("command")]
                for p in (artifact.get("post_shutdown") or {}).get("residual_processes") or []
            ],
        ),
        "<h2>Run summary figures</h2>",
        _table(["figure", "value"], sorted((summary.get("run_summary_figures") or {}).items())),
    ]
    title = html.escape(f"soak report {context.get('run_id', '')}")
    return (
        f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>{title}</title>'
        f"<style>{STYLE}</style></head><body>{''.join(body)}</body></html>\n"
    )
