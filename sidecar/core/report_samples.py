"""What a report reads of each sample (pure): the one parser of samples.jsonl.gz's lines, and the
JSON decoder the artifact's parser (sidecar.core.report_input) shares. A line is untrusted input:
parsed without NaN or Infinity, every field the plots draw checked for its type and range."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass

from sidecar.core.errors import ConfigError
from sidecar.core.report_fields import as_list, as_object, clip, integer, number, optional_number, text


@dataclass(frozen=True)
class ReportSample:
    """One sample as the plots draw it; absent figures read as 0, as the sidecar writes them."""

    t_wall: float
    rss_kib: float
    fd_classes: tuple[tuple[str, float], ...]
    processes: float
    zombies: float
    gpu_used_mib: tuple[tuple[str, float], ...]  # (device label, memory used)
    progress_bytes: float
    # The trainer's step, and the samples and tokens it counted, as its last progress record said
    # (None: it writes none, or not that figure).
    step: float | None = None
    samples: float | None = None
    tokens: float | None = None
    # (device label, its active clock-event reasons) of each GPU that read them in this sample.
    clock_reasons: tuple[tuple[str, tuple[str, ...]], ...] = ()


def _refuse_constant(token: str) -> float:
    raise ValueError(f"{token} is not a finite number")


# One decoder for every line: json.loads with an argument builds a new one per call.
_DECODER = json.JSONDecoder(parse_constant=_refuse_constant)


def load_json(data: bytes, where: str) -> object:
    """``data`` as JSON without NaN or Infinity; a ConfigError (never a RecursionError) otherwise."""
    try:
        return _DECODER.decode(data.decode("utf-8"))
    except RecursionError as exc:
        raise ConfigError(f"{where} is nested too deeply to parse") from exc
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError, integers over Python's digit limit
        raise ConfigError(f"{where} is not valid JSON: {clip(str(exc))}") from exc


def parse_sample(line: bytes) -> ReportSample:
    """One line of samples.jsonl.gz; a ConfigError for a line the report cannot draw."""
    doc = as_object(load_json(line, "sample"), "sample")
    tree, progress = as_object(doc.get("process"), "process"), as_object(doc.get("progress"), "progress")
    gpu_used: list[tuple[str, float]] = []
    clock_reasons: list[tuple[str, tuple[str, ...]]] = []
    for device in as_list(as_object(doc.get("gpu"), "gpu").get("devices"), "gpu.devices"):
        _device(as_object(device, "gpu device"), gpu_used, clock_reasons)
    return ReportSample(
        t_wall=number(doc.get("t_wall"), "t_wall"),
        rss_kib=number(tree.get("rss_kib_total", 0), "rss_kib_total"),
        fd_classes=tuple(
            (name, number(count, "fd_classes_total"))
            for name, count in as_object(tree.get("fd_classes_total"), "fd_classes_total").items()
        ),
        processes=number(tree.get("process_count", 0), "process_count"),
        zombies=number(tree.get("zombie_count", 0), "zombie_count"),
        gpu_used_mib=tuple(gpu_used),
        progress_bytes=number(progress.get("bytes_total", 0), "bytes_total"),
        step=optional_number(progress.get("step"), "progress.step"),
        samples=optional_number(progress.get("samples"), "progress.samples"),
        tokens=optional_number(progress.get("tokens"), "progress.tokens"),
        clock_reasons=tuple(clock_reasons),
    )


def _device(
    device: Mapping[str, object],
    used_mib: list[tuple[str, float]],
    clock_reasons: list[tuple[str, tuple[str, ...]]],
) -> None:
    """A device's memory used and active clock-event reasons, each by its plot label, when it read them."""
    used, reasons = device.get("memory_used_mib"), device.get("clock_event_reasons")
    if used is None and reasons is None:
        return
    index = integer(device.get("index"), "gpu device index")
    label = f"GPU {index} {text(device.get('uuid', ''), 'gpu device uuid')[:12]}"
    if used is not None:
        used_mib.append((label, number(used, "memory_used_mib")))
    if reasons is not None:
        names = as_list(reasons, "clock_event_reasons")
        clock_reasons.append((label, tuple(text(name, "clock_event_reasons[]") for name in names)))
