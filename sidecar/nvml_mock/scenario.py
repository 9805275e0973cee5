"""Scenario JSON for the mock NVML library, validated here and compiled to the flat file it reads.

The JSON format is documented in docs/nvml-mock.md. The C side only parses ``key=value`` lines, so
all validation (and every helpful error message) lives here.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from sidecar.core.errors import ConfigError
from sidecar.core.gpu_health import CLOCK_EVENT_REASONS

FORMAT = "soak-nvml-mock/1"

# NVML return codes a scenario may inject, by the names nvml.h gives them (without NVML_ERROR_).
ERROR_CODES: dict[str, int] = {
    "NO_PERMISSION": 4,
    "NOT_SUPPORTED": 3,
    "DRIVER_NOT_LOADED": 9,
    "TIMEOUT": 10,
    "FUNCTION_NOT_FOUND": 13,
    "GPU_IS_LOST": 15,
    "RESET_REQUIRED": 16,
    "NO_DATA": 21,
    "INSUFFICIENT_RESOURCES": 23,
    "UNKNOWN": 999,
}

# A metric name (as the sidecar reports it in ``unavailable``) -> the mock functions behind it.
METRIC_FUNCTIONS: dict[str, tuple[str, ...]] = {
    "memory": ("memory", "memory_v2"),
    "memory_v2": ("memory_v2",),
    "utilization": ("utilization",),
    "temperature": ("temperature", "temperature_v"),
    "temperature_v": ("temperature_v",),
    "power": ("power",),
    "sm_clock": ("clock_sm",),
    "mem_clock": ("clock_mem",),
    "graphics_clock": ("clock_graphics",),
    "ecc": ("ecc",),
    "retired_pages": ("retired_pages",),
    "compute_processes": ("compute_processes",),
    "graphics_processes": ("graphics_processes",),
    "name": ("name",),
    "uuid": ("uuid",),
    "events": ("events",),
    "remapped_rows": ("remapped_rows",),
    "retired_pages_pending": ("retired_pages_pending",),
    "clock_event_reasons": ("clock_event_reasons", "clock_throttle_reasons"),
    "clock_throttle_reasons": ("clock_throttle_reasons",),
    "pcie_replay": ("pcie_replay",),
    "nvlink": ("nvlink",),
    "recovery_action": ("field_values",),
}

# NVML symbols a scenario may declare absent (an older driver), -> mock function keys.
MISSING_FUNCTIONS: dict[str, str] = {
    "nvmlDeviceGetMemoryInfo_v2": "memory_v2",
    "nvmlDeviceGetTemperatureV": "temperature_v",
    "nvmlDeviceGetComputeRunningProcesses_v3": "compute_processes",
    "nvmlDeviceGetGraphicsRunningProcesses_v3": "graphics_processes",
    "nvmlDeviceGetRetiredPages": "retired_pages",
    "nvmlDeviceGetTotalEccErrors": "ecc",
    "nvmlDeviceGetRemappedRows": "remapped_rows",
    "nvmlDeviceGetRetiredPagesPendingStatus": "retired_pages_pending",
    # A driver before 535: the same bits under the older name (the sidecar falls back to it).
    "nvmlDeviceGetCurrentClocksEventReasons": "clock_event_reasons",
    "nvmlDeviceGetPcieReplayCounter": "pcie_replay",
    "nvmlDeviceGetNvLinkState": "nvlink",
    "nvmlDeviceRegisterEvents": "events",
    "nvmlDeviceGetFieldValues": "field_values",
}
RecoveryAction = Literal["none", "gpu_reset", "node_reboot", "drain_p2p", "drain_and_reset"]
# NVML_GPU_RECOVERY_ACTION_* by the names a scenario gives them.
RECOVERY_ACTIONS = {"none": 0, "gpu_reset": 1, "node_reboot": 2, "drain_p2p": 3, "drain_and_reset": 4}
# A driver without the event API at all: nvmlEventSetCreate and the rest are missing.
NO_EVENT_API = "nvmlEventSetCreate"
EVENT_TYPES = {"ecc_single_bit": 0x1, "ecc_double_bit": 0x2, "xid": 0x8}
MAX_EVENTS = 64
MAX_LINKS = 36

MAX_DEVICES = 64
MAX_POINTS = 64
MAX_PROCESSES = 64

Point = tuple[Annotated[float, Field(ge=0)], Annotated[float, Field(ge=0)]]
# A constant, or (t, value) points interpolated linearly and held after the last one.
Series = Annotated[float, Field(ge=0)] | Annotated[list[Point], Field(min_length=1, max_length=MAX_POINTS)]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class InjectedError(_Model):
    code: str
    from_t: float = Field(0.0, ge=0, alias="from")
    until_t: float | None = Field(None, gt=0, alias="until")

    @field_validator("code")
    @classmethod
    def _known(cls, code: str) -> str:
        if code not in ERROR_CODES:
            raise ValueError(f"unknown NVML error {code!r}; known: {', '.join(sorted(ERROR_CODES))}")
        return code


class MockProcess(_Model):
    pid: int | str = Field(
        description="A literal PID; '$ENV_NAME' (that variable of the process using NVML); "
        "'@/path' (a file holding the PID); '~text' (the lowest PID whose command line contains "
        "text, the caller's own descendants first). Resolved at each query; an unresolved one hides "
        "the process."
    )
    used_memory_mib: Series = 0.0
    kind: Literal["compute", "graphics"] = "compute"

    @field_validator("pid")
    @classmethod
    def _pid_form(cls, pid: int | str) -> int | str:
        if isinstance(pid, int):
            if pid <= 0:
                raise ValueError("pid must be positive")
            return pid
        if len(pid) < 2 or pid[0] not in "$@~" or "\n" in pid or len(pid) > 500:
            raise ValueError("pid must be an integer, '$ENV_NAME', '@/pidfile' or '~cmdline text'")
        return pid


class MockEvent(_Model):
    at: float = Field(ge=0, description="When it happens, in the scenario's time unit.")
    type: Literal["xid", "ecc_single_bit", "ecc_double_bit"]
    data: int = Field(0, ge=0, le=2**63, description="The XID number; for ECC events, the count.")


class RemappedRows(_Model):
    correctable: int = Field(0, ge=0, le=2**32 - 1)
    uncorrectable: int = Field(0, ge=0, le=2**32 - 1)
    pending: bool = False
    failure: bool = False


class ClockReasons(_Model):
    at: float = Field(ge=0)
    reasons: list[str] = Field(default_factory=list, description="Active from ``at`` on, by name.")

    @field_validator("reasons")
    @classmethod
    def _known(cls, reasons: list[str]) -> list[str]:
        unknown = [name for name in reasons if name not in CLOCK_EVENT_REASONS]
        if unknown:
            raise ValueError(
                f"unknown clock-event reasons {unknown}; known: {', '.join(CLOCK_EVENT_REASONS)}"
            )
        return reasons


class MockLink(_Model):
    active: bool = True
    replay: int = Field(0, ge=0)
    recovery: int = Field(0, ge=0)
    crc_flit: int = Field(0, ge=0)
    crc_data: int = Field(0, ge=0)


class MockDevice(_Model):
    uuid: str = Field(pattern=r"^GPU-[0-9a-fA-F-]{8,80}$")
    name: str = Field("NVIDIA H100 80GB HBM3", pattern=r"^[^\r\n]{1,90}$")
    memory_total_mib: float = Field(81559.0, gt=0)
    memory_reserved_mib: float = Field(0.0, ge=0)
    memory_used_mib: Series = 0.0
    utilization_gpu_pct: int = Field(0, ge=0, le=100)
    utilization_memory_pct: int = Field(0, ge=0, le=100)
    temperature_c: int = Field(40, ge=0, le=200)
    power_w: float = Field(70.0, ge=0, le=4_000_000)
    graphics_clock_mhz: int = Field(1980, ge=0)
    sm_clock_mhz: int = Field(1980, ge=0)
    mem_clock_mhz: int = Field(2619, ge=0)
    ecc_uncorrected: Series = Field(
        0.0, description="Uncorrected ECC errors counted so far; points step, they do not ramp."
    )
    ecc_corrected: Series = Field(
        0.0, description="Corrected (single-bit) ECC errors counted so far; points step, they do not ramp."
    )
    retired_pages_sbe: int = Field(0, ge=0, le=10_000)
    retired_pages_dbe: int = Field(0, ge=0, le=10_000)
    errors: dict[str, str | InjectedError] = Field(default_factory=dict)
    lost_at: float | None = Field(None, ge=0)
    reset_required_at: float | None = Field(None, ge=0)
    processes: list[MockProcess] = Field(default_factory=list, max_length=MAX_PROCESSES)
    events: list[MockEvent] = Field(default_factory=list, max_length=MAX_EVENTS)
    remapped_rows: RemappedRows = Field(default_factory=RemappedRows)
    retired_pages_pending: bool = False
    recovery_action: RecoveryAction | None = Field(
        "none", description="What NVML's recovery-action field says the device needs; null: not reported."
    )
    clock_event_reasons: list[ClockReasons] = Field(default_factory=list, max_length=MAX_POINTS)
    pcie_replay_count: Series = 0.0
    nvlink: list[MockLink] = Field(
        default_factory=list, max_length=MAX_LINKS, description="Empty: no NVLink (NOT_SUPPORTED)."
    )

    @field_validator("errors")
    @classmethod
    def _known_metrics(cls, errors: dict[str, str | InjectedError]) -> dict[str, str | InjectedError]:
        for metric, err in errors.items():
            if metric not in METRIC_FUNCTIONS:
                raise ValueError(f"unknown metric {metric!r}; known: {', '.join(sorted(METRIC_FUNCTIONS))}")
            if isinstance(err, str) and err not in ERROR_CODES:
                raise ValueError(f"unknown NVML error {err!r}; known: {', '.join(sorted(ERROR_CODES))}")
        return errors


class Scenario(_Model):
    driver_version: str = Field("550.54.15", pattern=r"^[0-9][0-9.]{0,30}$")
    time_unit: Literal["seconds", "samples"] = Field(
        "seconds",
        description="seconds: since nvmlInit. samples: the number of memory queries made on that "
        "device so far, i.e. the sidecar's sample count.",
    )
    init_error: str | None = None
    missing_functions: list[str] = Field(default_factory=list)
    devices: list[MockDevice] = Field(default_factory=list, max_length=MAX_DEVICES)
    devices_by_index: dict[Annotated[int, Field(ge=0)], list[MockDevice]] = Field(
        default_factory=dict,
        max_length=MAX_DEVICES,
        description="A multi-pod soak (an Indexed Job): the devices of the pod with that completion "
        "index, in place of devices; say, one node whose GPU is lost.",
    )

    def devices_for(self, index: int | None) -> list[MockDevice]:
        """The devices the pod of completion ``index`` sees (``devices`` outside an Indexed Job)."""
        return self.devices_by_index.get(index, self.devices) if index is not None else self.devices

    @model_validator(mode="after")
    def _consistent(self) -> Scenario:
        if self.init_error is not None and self.init_error not in ERROR_CODES:
            raise ValueError(f"unknown init_error {self.init_error!r}")
        unknown = [
            name for name in self.missing_functions if name not in MISSING_FUNCTIONS and name != NO_EVENT_API
        ]
        if unknown:
            raise ValueError(f"cannot mark {unknown} missing; known: {', '.join(sorted(MISSING_FUNCTIONS))}")
        for devices in (self.devices, *self.devices_by_index.values()):
            uuids = [device.uuid for device in devices]
            if len(set(uuids)) != len(uuids):
                raise ValueError("device UUIDs must be unique")
            if len(devices) > MAX_DEVICES:
                raise ValueError(f"at most {MAX_DEVICES} devices")
        return self


def load_scenario(path: Path) -> Scenario:
    """Parse and validate a scenario JSON file; ConfigError with the reason otherwise."""
    try:
        return Scenario.model_validate(json.loads(path.read_text(encoding="utf-8")))
    except ValidationError as exc:
        # One line per error: pydantic's own text spans lines and links to its docs.
        problems = "; ".join(
            f"{'.'.join(str(part) for part in err['loc']) or 'scenario'}: {err['msg']}"
            for err in exc.errors()
        )
        raise ConfigError(f"NVML mock scenario {path}: {problems}") from exc
    except (OSError, ValueError) as exc:
        raise ConfigError(f"NVML mock scenario {path}: {exc}") from exc


def _series(value: float | list[tuple[float, float]]) -> str:
    points = [(0.0, value)] if isinstance(value, (int, float)) else sorted(value)
    return ",".join(f"{t!r}:{v!r}" for t, v in points)


def _error(err: str | InjectedError) -> str:
    if isinstance(err, str):
        return f"{ERROR_CODES[err]},0,-1"
    until = -1.0 if err.until_t is None else err.until_t
    return f"{ERROR_CODES[err.code]},{err.from_t!r},{until!r}"


def render(scenario: Scenario, index: int | None = None) -> str:
    """The flat ``key=value`` text nvml_mock.c reads, for the pod of completion ``index``."""
    devices = scenario.devices_for(index)
    lines = [
        f"format={FORMAT}",
        f"driver_version={scenario.driver_version}",
        f"time_unit={scenario.time_unit}",
        f"init_error={ERROR_CODES[scenario.init_error] if scenario.init_error else 0}",
        f"device_count={len(devices)}",
    ]
    if NO_EVENT_API in scenario.missing_functions:
        lines.append("no_event_api=1")
    missing = {MISSING_FUNCTIONS[name] for name in scenario.missing_functions if name in MISSING_FUNCTIONS}
    for i, dev in enumerate(devices):
        d = f"d{i}."
        lines += [
            f"{d}uuid={dev.uuid}",
            f"{d}name={dev.name}",
            f"{d}total_mib={dev.memory_total_mib!r}",
            f"{d}reserved_mib={dev.memory_reserved_mib!r}",
            f"{d}used_mib={_series(dev.memory_used_mib)}",
            f"{d}util_gpu={dev.utilization_gpu_pct}",
            f"{d}util_mem={dev.utilization_memory_pct}",
            f"{d}temperature_c={dev.temperature_c}",
            f"{d}power_mw={round(dev.power_w * 1000)}",
            f"{d}clock_graphics={dev.graphics_clock_mhz}",
            f"{d}clock_sm={dev.sm_clock_mhz}",
            f"{d}clock_mem={dev.mem_clock_mhz}",
            f"{d}ecc_uncorrected={_series(dev.ecc_uncorrected)}",
            f"{d}ecc_corrected={_series(dev.ecc_corrected)}",
            f"{d}retired_sbe={dev.retired_pages_sbe}",
            f"{d}retired_dbe={dev.retired_pages_dbe}",
        ]
        if dev.lost_at is not None:
            lines.append(f"{d}lost_at={dev.lost_at!r}")
        if dev.reset_required_at is not None:
            lines.append(f"{d}reset_at={dev.reset_required_at!r}")
        lines += _health_lines(d, dev)
        injected: dict[str, str] = {}
        for metric, err in dev.errors.items():
            for function in METRIC_FUNCTIONS[metric]:
                injected[function] = _error(err)
        for function in missing:
            injected[function] = _error("FUNCTION_NOT_FOUND")
        lines += [f"{d}err.{function}={text}" for function, text in sorted(injected.items())]
        for j, proc in enumerate(dev.processes):
            p = f"{d}p{j}."
            lines += [
                f"{p}pid={proc.pid}",
                f"{p}used_mib={_series(proc.used_memory_mib)}",
                f"{p}kind={proc.kind}",
            ]
    return "\n".join(lines) + "\n"


def _health_lines(d: str, dev: MockDevice) -> list[str]:
    rows = dev.remapped_rows
    lines = [
        f"{d}remapped_rows={rows.correctable},{rows.uncorrectable},{int(rows.pending)},{int(rows.failure)}",
        f"{d}retired_pending={int(dev.retired_pages_pending)}",
        f"{d}recovery_action={RECOVERY_ACTIONS.get(dev.recovery_action or '', -1)}",
        f"{d}pcie_replay={_series(dev.pcie_replay_count)}",
    ]
    if dev.clock_event_reasons:
        steps = sorted(dev.clock_event_reasons, key=lambda step: step.at)
        masks = [
            (step.at, float(sum(CLOCK_EVENT_REASONS[name] for name in set(step.reasons)))) for step in steps
        ]
        lines.append(f"{d}clock_reasons={_series(masks)}")
    for j, event in enumerate(sorted(dev.events, key=lambda event: event.at)):
        lines.append(f"{d}event{j}={event.at!r},{EVENT_TYPES[event.type]},{event.data}")
    for j, link in enumerate(dev.nvlink):
        counters = f"{link.replay},{link.recovery},{link.crc_flit},{link.crc_data}"
        lines.append(f"{d}link{j}={int(link.active)},{counters}")
    return lines


def compile_scenario(source: Path | Scenario, out_dir: Path, *, index: int | None = None) -> Path:
    """Validate a scenario (JSON path or model) and write its flat form atomically into out_dir, for
    the pod of completion ``index`` (None: not an Indexed Job)."""
    scenario = load_scenario(source) if isinstance(source, Path) else source
    out_dir.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".scenario-", suffix=".tmp", dir=out_dir)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(render(scenario, index))
        name = (source.stem if isinstance(source, Path) else "scenario") + ".nvmlmock"
        target = out_dir / name
        os.chmod(tmp, 0o644)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return target
