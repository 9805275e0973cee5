"""One page for a whole run (pure): every attempt of every index on one time line, where the
budget went (``sidecar.core.ledger.budget``) and a link to each attempt's own page.

Self-contained like an attempt's page: inline SVG, no script, no network; links are relative.
Every value shown comes from artifacts and is escaped.
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from dataclasses import dataclass

from sidecar.core.artifact.models import claimed_utc
from sidecar.core.ledger.budget import AttemptEntry, RunBudget, run_budget
from sidecar.core.ledger.phases import PHASES, AttemptPhases, Phase, PhaseKind
from sidecar.core.ledger.record import LOST, Ledger, LedgerEntry
from sidecar.core.report import STYLE, html_table
from sidecar.core.report_axes import duration_text
from sidecar.core.report_input import ReportArtifact
from sidecar.core.slow_index import IndexRate, slow_indexes

COLOURS: dict[PhaseKind, str] = {
    "scheduling": "#c7c7c7",
    "container_start": "#9edae5",
    "launcher": "#aec7e8",
    "startup": "#ffbb78",
    "productive": "#2ca02c",
    "lost_work": "#d62728",
    "checkpointing": "#9467bd",
    "teardown": "#7f7f7f",
}
WIDTH, ROW, LEFT = 900, 22, 150
ATTEMPT_COLUMNS = ("attempt", "index", "verdict", "classification", "started", "time", "productive", "page")


@dataclass(frozen=True)
class RunAttempt:
    """One attempt's artifact and where its own page is (relative to the run's page)."""

    name: str
    artifact: ReportArtifact
    page: str
    # Its evidence read back differs from the SHA-256 its artifact recorded (named on its page).
    evidence_mismatched: bool = False


def entry_of(attempt: RunAttempt) -> AttemptEntry | None:
    """The attempt on the run's time line; None when it has no phases (it never ran, or it ended
    without a verdict)."""
    found = attempt.artifact
    phases = tuple(
        Phase(kind, start, start + seconds) for kind, start, seconds in found.phases or () if kind in PHASES
    )
    if not phases:
        return None
    return AttemptEntry(
        attempt=found.attempt or 0,
        index=found.index,
        start=phases[0].start,
        end=phases[-1].end,
        phases=AttemptPhases(phases, found.lost_work_known),
        cause=None if found.status == "passed" else (found.classification or found.status),
    )


def render_run_report(run_id: str, attempts: Sequence[RunAttempt], ledger: Ledger | None = None) -> str:
    """The run's page; ``ledger`` adds the attempts it lists that have no artifact here (an attempt
    that ended without a verdict, one whose artifact was not found)."""
    entries = [e for e in map(entry_of, attempts) if e is not None]
    seen = {(a.artifact.index, a.artifact.attempt) for a in attempts}
    only = [e for e in ledger.entries if (e.index, e.attempt) not in seen] if ledger else []
    entries += [e.as_attempt() for e in only]
    starts = [
        a.artifact.deadline_started_unix for a in attempts if a.artifact.deadline_started_unix is not None
    ]
    if ledger is not None and ledger.deadline_started_unix is not None:
        starts.append(ledger.deadline_started_unix)
    start = min(starts or [e.start for e in entries] or [0.0])
    until = max([e.end for e in entries] or [start])
    budget = run_budget(entries, deadline_start=start, until=until)
    badput = sorted(budget.badput_s.items())
    body = [
        f"<h1>soak {html.escape(run_id)}: {len(attempts)} attempt{'s' if len(attempts) != 1 else ''}</h1>",
        f"<p>{html.escape(_budget_line(budget, start))}</p>",
        "<h2>Attempts</h2>",
        _attempts_table(attempts, only),
        *_slow_section(attempts, only),
        "<h2>Time line</h2>",
        _timeline(entries, start, until),
        "<h2>Where the budget went</h2>",
        html_table(["cause", "time", "share"], [[c, duration_text(s), _share(s, budget)] for c, s in badput]),
    ]
    title = html.escape(run_id)
    return (
        f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>soak {title}</title>'
        f"<style>{STYLE}</style></head><body>{''.join(body)}</body></html>\n"
    )


def _slow_section(attempts: Sequence[RunAttempt], only: Sequence[LedgerEntry]) -> list[str]:
    """The indexes whose trainer ran well below the others' median rate (sidecar.core.slow_index),
    by their latest attempts' mean steps per second; nothing when none is."""
    rates = [
        IndexRate(found.index, found.attempt or 0, found.steps_per_s, found.node)
        for found in (a.artifact for a in attempts)
        if found.index is not None and found.steps_per_s is not None
    ]
    rates += [
        IndexRate(e.index, e.attempt, e.steps_per_s, e.node)
        for e in only
        if e.index is not None and e.steps_per_s is not None
    ]
    slow = slow_indexes(rates)
    if not slow:
        return []
    return ["<h2>Slow index</h2>", *(f"<p>{html.escape(each.describe())}</p>" for each in slow)]


def _budget_line(budget: RunBudget, start: float) -> str:
    began = claimed_utc(start) or "unknown"
    return (
        f"deadline started {began}; {duration_text(budget.wall_s)} since; productive "
        f"{duration_text(budget.productive_s)}; goodput {budget.goodput:.1%}"
    )


def _share(seconds: float, budget: RunBudget) -> str:
    whole = budget.productive_s + sum(budget.badput_s.values())
    return f"{seconds / whole:.1%}" if whole > 0 else "-"


def _attempts_table(attempts: Sequence[RunAttempt], only: Sequence[LedgerEntry]) -> str:
    """The attempts, each linked to its own page (every cell escaped, the link built here); those
    only the ledger lists name where their evidence is."""
    head = "".join(f"<th>{name}</th>" for name in ATTEMPT_COLUMNS)
    rows = []
    for attempt in attempts:
        cells = "".join(f"<td>{html.escape(cell)}</td>" for cell in _row(attempt, entry_of(attempt)))
        link = f'<a href="{html.escape(attempt.page, quote=True)}">{html.escape(attempt.name)}</a>'
        rows.append(f"<tr>{cells}<td>{link}</td></tr>")
    for entry in only:
        texts = [
            str(entry.attempt),
            "-" if entry.index is None else str(entry.index),
            "no verdict" if entry.status == LOST else entry.status,
            entry.classification or "-",
            claimed_utc(entry.start) or "-",
            duration_text(entry.end - entry.start),
            duration_text(sum(p.seconds for p in entry.phases if p.kind == "productive")),
            f"ledger: {entry.artifact or '-'}",
        ]
        rows.append(f"<tr>{''.join(f'<td>{html.escape(text)}</td>' for text in texts)}</tr>")
    return f"<table><tr>{head}</tr>{''.join(rows)}</table>"


def _row(attempt: RunAttempt, entry: AttemptEntry | None) -> list[str]:
    found = attempt.artifact
    productive = entry.phases.seconds("productive") if entry else None
    return [
        "-" if found.attempt is None else str(found.attempt),
        "-" if found.index is None else str(found.index),
        f"{found.status} (evidence not matching)" if attempt.evidence_mismatched else found.status,
        found.classification or "-",
        (claimed_utc(entry.start) if entry else None) or found.started_at or "-",
        duration_text(entry.end - entry.start) if entry else "-",
        "-" if productive is None else duration_text(productive),
    ]


def _timeline(entries: Sequence[AttemptEntry], start: float, until: float) -> str:
    """One bar per attempt, its phases coloured by kind, on the run's time axis."""
    if not entries:
        return "<p>no attempt ran</p>"
    scale = (WIDTH - LEFT - 10) / max(until - start, 1e-9)
    rows = sorted(entries, key=lambda e: (-1 if e.index is None else e.index, e.start))
    parts = []
    for n, entry in enumerate(rows):
        y = 10 + n * ROW
        label = f"attempt {entry.attempt}" + ("" if entry.index is None else f" (index {entry.index})")
        parts.append(f'<text x="4" y="{y + 14}" class="axis">{html.escape(label)}</text>')
        if not entry.phases.phases:  # ended without a verdict: its span, no phase guessed
            x = LEFT + (max(entry.start, start) - start) * scale
            width = max(0.5, (min(entry.end, until) - max(entry.start, start)) * scale)
            parts.append(
                f'<rect x="{x:.1f}" y="{y}" width="{width:.1f}" height="{ROW - 6}" fill="none" '
                f'stroke="#7f7f7f" stroke-dasharray="4 2"><title>{html.escape(entry.cause or "")}: '
                f"{duration_text(entry.end - entry.start)}</title></rect>"
            )
        for phase in entry.phases.phases:
            x = LEFT + (max(phase.start, start) - start) * scale
            width = max(0.5, (min(phase.end, until) - max(phase.start, start)) * scale)
            parts.append(
                f'<rect x="{x:.1f}" y="{y}" width="{width:.1f}" height="{ROW - 6}" '
                f'fill="{COLOURS[phase.kind]}">'
                f"<title>{phase.kind}: {duration_text(phase.seconds)}</title></rect>"
            )
    legend = "".join(
        f'<span style="background:{colour};padding:0 6px;margin-right:8px">{kind.replace("_", " ")}</span>'
        for kind, colour in COLOURS.items()
    )
    return f'<svg width="{WIDTH}" height="{20 + len(rows) * ROW}">{"".join(parts)}</svg><p>{legend}</p>'
