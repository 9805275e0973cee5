"""The kit's stop agreement: the ranks agree at the same call, about once per ``stop_check_s``, with
no collective and no host sync in the calls between (a fake torch with a device tensor counts both)."""

from __future__ import annotations

import sys
import threading
import types
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from soak_sidecar_kit import Soak
from soak_sidecar_kit._stop import MAX_EVERY


class FakeClock:
    def __init__(self, step_s: float) -> None:
        self.now = 0.0
        self.step_s = step_s

    def __call__(self) -> float:
        return self.now


@dataclass
class FakeDevice:
    """What torch.distributed under NCCL would see: collectives and host syncs (reading a device
    tensor), each counted, and the device every tensor was made on."""

    all_reduces: int = 0
    host_syncs: int = 0
    devices: set[str] = field(default_factory=set)


class FakeTensor:
    def __init__(self, values: list[int], device: FakeDevice) -> None:
        self.values = list(values)
        self._device = device

    def tolist(self) -> list[int]:
        self._device.host_syncs += 1
        return list(self.values)


@pytest.fixture
def fake_torch(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeDevice]:
    """torch and torch.distributed as the kit reaches them: an NCCL group of two ranks, the other
    rank never asking for the stop (MAX with zeros)."""
    device = FakeDevice()
    torch = types.ModuleType("torch")
    dist = types.ModuleType("torch.distributed")

    def tensor(values: list[int], dtype: Any = None, device: str = "cpu") -> FakeTensor:
        fake.devices.add(device)
        return FakeTensor(values, fake)

    def all_reduce(value: FakeTensor, op: Any = None) -> None:
        assert op == "max"
        fake.all_reduces += 1

    fake = device
    torch.tensor = tensor  # type: ignore[attr-defined]
    torch.int64 = "int64"  # type: ignore[attr-defined]
    torch.cuda = types.SimpleNamespace(current_device=lambda: 0)  # type: ignore[attr-defined]
    dist.is_available = lambda: True  # type: ignore[attr-defined]
    dist.is_initialized = lambda: True  # type: ignore[attr-defined]
    dist.get_world_size = lambda: 2  # type: ignore[attr-defined]
    dist.get_backend = lambda: "nccl"  # type: ignore[attr-defined]
    dist.ReduceOp = types.SimpleNamespace(MAX="max")  # type: ignore[attr-defined]
    dist.all_reduce = all_reduce  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "torch", torch)
    monkeypatch.setitem(sys.modules, "torch.distributed", dist)
    yield device


def steps_until_stop(soak: Soak, clock: FakeClock, steps: int, ask_at: int | None = None) -> int | None:
    for step in range(steps):
        if step == ask_at:
            soak.stopped_from_outside()
        if soak.should_stop():
            return step
        clock.now += clock.step_s
    return None


@pytest.mark.parametrize("step_s", [0.001, 0.004])
def test_no_collective_and_no_host_sync_per_step_under_nccl(fake_torch: FakeDevice, step_s: float) -> None:
    clock = FakeClock(step_s)
    soak = Soak(environ={}, handle_signal=False, clock=clock)
    assert steps_until_stop(soak, clock, 10_000) is None
    # About one agreement per second of steps (at most MAX_EVERY steps apart), each one collective
    # and one host sync, on the rank's own GPU.
    seconds = 10_000 * step_s
    assert fake_torch.all_reduces <= seconds / 1.0 + 10_000 / MAX_EVERY + 3
    assert fake_torch.host_syncs == fake_torch.all_reduces and fake_torch.devices == {"cuda:0"}


def test_slow_steps_agree_every_step_and_the_stop_lands_at_once(fake_torch: FakeDevice) -> None:
    clock = FakeClock(30.0)
    soak = Soak(environ={}, handle_signal=False, clock=clock)
    assert steps_until_stop(soak, clock, 50, ask_at=20) == 20
    assert fake_torch.all_reduces == 21


def test_the_stop_lands_within_the_stated_delay(fake_torch: FakeDevice) -> None:
    """Asked at any step, the stop lands within stop_check_s of steps (plus one) at a steady pace."""
    for ask_at in (0, 1, 7, 500, 999, 1_234):
        clock = FakeClock(0.004)
        soak = Soak(environ={}, handle_signal=False, clock=clock, stop_check_s=1.0)
        stopped = steps_until_stop(soak, clock, 5_000, ask_at=ask_at)
        assert stopped is not None and 0 <= (stopped - ask_at) * clock.step_s <= 1.0 + clock.step_s


class Exchange:
    """The MAX all-reduce of two real ranks (threads): a barrier per collective, so ranks whose
    schedules differed would meet nobody and fail instead of agreeing."""

    def __init__(self, ranks: int) -> None:
        self._barrier = threading.Barrier(ranks, timeout=10)
        self._lock = threading.Lock()
        self._values: list[list[int]] = []
        self.result: list[int] = []

    def reduce_max(self, values: list[int]) -> list[int]:
        with self._lock:
            self._values.append(values)
        if self._barrier.wait() == 0:
            self.result = [max(column) for column in zip(*self._values, strict=True)]
            self._values = []
        self._barrier.wait()
        return list(self.result)


def test_two_ranks_at_different_paces_stop_at_the_same_step() -> None:
    exchange = Exchange(2)
    stopped: dict[int, int | None] = {}

    def rank(index: int, step_s: float, ask_at: int | None) -> None:
        clock = FakeClock(step_s)
        soak = Soak(environ={}, handle_signal=False, clock=clock, reduce_max=exchange.reduce_max)
        stopped[index] = steps_until_stop(soak, clock, 3_000, ask_at=ask_at)

    threads = [
        threading.Thread(target=rank, args=(0, 0.001, None)),
        threading.Thread(target=rank, args=(1, 0.003, 1_700)),
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert stopped[0] is not None and stopped[0] == stopped[1]
    # Within a second of the slower rank's steps (the smaller proposal wins).
    assert 0 <= stopped[0] - 1_700 <= 1.0 / 0.003 + 1


def test_alone_the_stop_is_seen_at_the_next_call(tmp_path: Any) -> None:
    soak = Soak(environ={"SOAK_SOFT_STOP_FILE": str(tmp_path / "stop")}, handle_signal=False)
    assert not soak.should_stop()
    (tmp_path / "stop").touch()
    assert soak.stop_requested and soak.should_stop() and soak.should_stop()


def test_a_stop_check_interval_that_is_not_a_number_of_seconds_is_refused() -> None:
    with pytest.raises(ValueError, match="stop_check_s"):
        Soak(environ={}, handle_signal=False, stop_check_s=float("nan"))
