"""The launcher with real processes and signals, driven through the run dir like the sidecar does."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import psutil
import pytest

from sidecar.adapters.rundir.channel import Heartbeat, RunDir
from sidecar.adapters.rundir.zipapp import launcher_path
from sidecar.launcher.proc import live_thread
from sidecar.launcher.protocol import names as proto
from sidecar.launcher.protocol.exit import ExitRecord
from sidecar.launcher.protocol.files import atomic_write_json, read_json
from sidecar.launcher.protocol.go import GoRequest
from sidecar.launcher.protocol.names import DEADLINE_SOFT_STOP
from sidecar.launcher.protocol.records import SoftStopRecord
from tests.components import require
from tests.fixtures.processes import Spawner, kill_orphan
from tests.waiting import wait_until

pytestmark = pytest.mark.integration

# A trainer that logs the signals it gets; options: ignore-term, child (a TERM-ignoring child),
# stop-on-usr1 (exits 0 on SIGUSR1, as a trainer does on the soft stop).
SIGNAL_TRAINER = """
import os, signal, subprocess, sys, time
log, opts = sys.argv[1], sys.argv[2:]
def record(signum, frame):
    with open(log, "a") as fh:
        fh.write(f"{signal.Signals(signum).name} {time.time()!r}\\n")
    if signum == signal.SIGUSR1 and "stop-on-usr1" in opts:
        sys.exit(0)
for s in (signal.SIGUSR1, signal.SIGUSR2, signal.SIGHUP, signal.SIGINT):
    signal.signal(s, record)
if "ignore-term" in opts:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
if "child" in opts:
    child = subprocess.Popen([sys.executable, "-c",
        "import signal, time\\n"
        "for s in (signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2):\\n"
        "    signal.signal(s, signal.SIG_IGN)\\n"
        "time.sleep(600)"])
    with open(log + ".child", "w") as fh:
        fh.write(str(child.pid))
with open(log + ".ready", "w") as fh:
    fh.write(str(os.getpid()))
while True:
    time.sleep(0.05)
"""

# The sidecar stand-in for the heartbeat test: announces, beats, gives go, then sleeps.
HEARTBEAT_DRIVER = """
import sys, time
from pathlib import Path
from sidecar.adapters.rundir.channel import Heartbeat, RunDir
from sidecar.adapters.rundir.local import spawn_local_launcher
from sidecar.launcher.protocol.go import GoRequest
run_dir, hb_timeout, mode, trainer = Path(sys.argv[1]), float(sys.argv[2]), sys.argv[3], sys.argv[4:]
rd = RunDir(run_dir)
if mode == "owner":
    proc = spawn_local_launcher(run_dir, trainer)
rd.wait_for_launcher(30)
with Heartbeat(rd, 0.2):
    rd.give_go(GoRequest(launch_id=rd.launch_id, deadline_unix=time.time() + 300, checkpoint_margin_s=10,
                         term_grace_s=5, heartbeat_timeout_s=hb_timeout, kill_grace_s=1,
                         console_log_bytes=1 << 20))
    time.sleep(600)
"""


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


@dataclass
class Run:
    proc: subprocess.Popen[bytes]
    rd: RunDir
    stdout: Path

    def go(
        self,
        *,
        deadline_in: float = 120.0,
        margin: float = 10.0,
        term_grace: float = 5.0,
        hb_timeout: float = 120.0,
        kill_grace: float = 1.0,
        cap: int = 1 << 20,
        soft_stop_signal: str = "SIGUSR1",
        stop_grace: float = 0.0,
        exit_grace: float = 0.5,
    ) -> float:
        self.rd.wait_for_launcher(30, alive=lambda: self.proc.poll() is None)
        deadline = time.time() + deadline_in
        self.rd.give_go(
            GoRequest(
                launch_id=str(self.rd.launch_id),
                deadline_unix=deadline,
                checkpoint_margin_s=margin,
                term_grace_s=term_grace,
                heartbeat_timeout_s=hb_timeout,
                kill_grace_s=kill_grace,
                console_log_bytes=cap,
                soft_stop_signal=soft_stop_signal,
                stop_grace_s=stop_grace,
                exit_grace_s=exit_grace,
                env={proto.ENV_RUN_ID: "6d1f3a52-2f0e-4c59-9d3e-2b1f0c1d2e3f"},
            )
        )
        return deadline

    def finish(self, timeout_s: float = 30.0) -> ExitRecord:
        rc = self.proc.wait(timeout=timeout_s)
        record = self.rd.read_exit()
        assert record is not None
        assert record.exit_code == rc
        return record


@pytest.fixture
def launch(tmp_path: Path, spawn: Spawner) -> Callable[..., Run]:
    """Starts the launcher (through ``spawn``: its tree is killed and reaped after the test)."""

    def _launch(command: list[str], *flags: str, python: Sequence[str] = (sys.executable,)) -> Run:
        rd = RunDir(tmp_path / "run")
        rd.reset()
        stdout = tmp_path / "launcher.stdout"
        with stdout.open("wb") as out:
            argv = [*python, str(launcher_path()), "--run-dir", str(rd.path), *flags, "--", *command]
            proc = spawn(argv, stdout=out)
        return Run(proc, rd, stdout)

    return _launch


def signal_trainer(tmp_path: Path, *opts: str) -> tuple[list[str], Path]:
    script = tmp_path / "signal_trainer.py"
    script.write_text(SIGNAL_TRAINER)
    log = tmp_path / "signals.log"
    return [sys.executable, str(script), str(log), *opts], log


def received(log: Path) -> list[str]:
    return [line.split()[0] for line in log.read_text().splitlines()] if log.exists() else []


def loop_turns(run: Run, log: Path, turns: int) -> None:
    """An ordering barrier on the launcher's event loop (docs/run-dir-protocol.md, Sequence 4).

    SIGUSR2 to the launcher ``turns`` times, each once the signal trainer logged the one before. A
    turn of the loop first forwards the signals its previous wait collected, then enforces deadline
    and heartbeat, reads the run-dir files that wait saw change, and waits again; so the n-th
    forwarded signal comes after n - 1 complete turns, all begun after the first signal was sent.
    Each forward also proves the trainer still alive then."""
    for _ in range(turns):
        logged = received(log).count("SIGUSR2") + 1
        run.proc.send_signal(signal.SIGUSR2)
        wait_until(f"SIGUSR2 number {logged} forwarded", _logs(log, "SIGUSR2", logged))


def _logs(log: Path, name: str, times: int) -> Callable[[], bool]:
    return lambda: received(log).count(name) == times


def soft_stop_record(run_dir: Path) -> SoftStopRecord | None:
    """soft_stop.json as the trainer reads it (the sidecar does not: exit.json carries the stop)."""
    raw = read_json(str(run_dir / proto.SOFT_STOP_FILE))
    return None if raw is None else SoftStopRecord.parse(raw)


def last_beat(rd: RunDir) -> dict[str, Any]:
    """The sidecar's latest heartbeat as written (seq, wall, ...); {} before the first."""
    return read_json(str(rd.file(proto.HEARTBEAT_FILE))) or {}


def test_deadline_soft_stop_then_kill_of_term_ignoring_trainer(
    launch: Callable[..., Run], tmp_path: Path
) -> None:
    command, log = signal_trainer(tmp_path, "ignore-term", "child")
    run = launch(command)
    deadline = run.go(deadline_in=4.0, margin=2.0, term_grace=1.0)
    ready = Path(str(log) + ".ready")
    wait_until("trainer ready", ready.exists)
    trainer_pid = int(ready.read_text())
    child_pid = int(Path(str(log) + ".child").read_text())
    record = run.finish()

    soft = soft_stop_record(run.rd.path)
    assert soft is not None and soft.reason == DEADLINE_SOFT_STOP  # what the verdict reads as the deadline
    assert soft.sent_unix >= deadline - 2.0 - 0.05
    usr1 = [float(line.split()[1]) for line in log.read_text().splitlines() if "SIGUSR1" in line]
    assert len(usr1) == 1, "soft-stop signal is sent exactly once"
    assert deadline - 2.0 - 0.05 <= usr1[0] < deadline
    assert record.reason == "deadline" and record.deadline_expired
    assert record.soft_stop_sent and record.term_sent and record.kill_sent
    assert record.signal == signal.SIGKILL and record.exit_code == 128 + signal.SIGKILL
    assert record.ended_unix is not None and record.ended_unix >= deadline - 0.05
    assert child_pid in {p.pid for p in record.killed_with_trainer}
    assert record.survivors_killed == (), "killed with the trainer, not left behind by it"
    assert gone(trainer_pid) and gone(child_pid)
    assert record.unreaped == ()


def test_signals_are_forwarded_and_signalled_exit_is_128_plus_signal(
    launch: Callable[..., Run], tmp_path: Path
) -> None:
    command, log = signal_trainer(tmp_path)
    run = launch(command)
    run.go()
    wait_until("trainer ready", Path(str(log) + ".ready").exists)
    for signum in (signal.SIGUSR2, signal.SIGHUP, signal.SIGINT, signal.SIGUSR1):
        run.proc.send_signal(signum)
        name = signal.Signals(signum).name
        wait_until(f"{name} received", lambda name=name: name in received(log))  # type: ignore[misc]
    run.proc.send_signal(signal.SIGTERM)
    record = run.finish()
    assert received(log) == ["SIGUSR2", "SIGHUP", "SIGINT", "SIGUSR1"]
    assert record.reason == "exited"
    assert record.signal == signal.SIGTERM and record.returncode is None
    assert record.exit_code == 128 + signal.SIGTERM
    assert list(record.signals_forwarded) == ["SIGUSR2", "SIGHUP", "SIGINT", "SIGUSR1", "SIGTERM"]


def test_a_stop_signal_is_the_soft_stop_first_and_reaches_the_trainer_after_the_grace(
    launch: Callable[..., Run], tmp_path: Path
) -> None:
    """The kubelet's SIGTERM (or Ctrl-C) with stop_grace_s > 0: the trainer first gets the soft stop,
    and SIGTERM only once the grace is over and it still runs."""
    command, log = signal_trainer(tmp_path)
    run = launch(command)
    run.go(stop_grace=1.0)
    wait_until("trainer ready", Path(str(log) + ".ready").exists)
    run.proc.send_signal(signal.SIGTERM)
    record = run.finish()
    assert received(log) == ["SIGUSR1"]  # the soft stop; SIGTERM then killed it (no handler)
    soft = soft_stop_record(run.rd.path)
    assert soft is not None and soft.reason == "signal: SIGTERM"
    assert (record.signals_deferred, record.signals_forwarded) == (("SIGTERM",), ("SIGTERM",))
    assert record.reason == "signalled" and record.signal == signal.SIGTERM
    times = record.stop_times_unix  # what the report marks on its plots
    assert set(times) == {"soft_stop", "term"} and times["term"] - times["soft_stop"] >= 1.0
    # The grace runs from the soft stop's sending (the trainer logs its arrival a little later, so
    # measuring from that log would shorten the grace by the delivery delay).
    usr1_at = float(log.read_text().split()[1])
    assert usr1_at < times["term"]  # the soft stop arrived within the grace, before the TERM
    assert record.ended_unix is not None and record.ended_unix - times["soft_stop"] >= 1.0


def test_a_trainer_that_stops_on_the_soft_stop_never_gets_the_stop_signal(
    launch: Callable[..., Run], tmp_path: Path
) -> None:
    command, log = signal_trainer(tmp_path, "stop-on-usr1")
    run = launch(command)
    run.go(stop_grace=600.0)
    wait_until("trainer ready", Path(str(log) + ".ready").exists)
    run.proc.send_signal(signal.SIGTERM)
    record = run.finish()
    assert received(log) == ["SIGUSR1"]
    assert record.exit_code == 0 and record.reason == "exited" and not record.term_sent
    assert (record.signals_deferred, record.signals_forwarded) == (("SIGTERM",), ())


def test_a_second_stop_signal_is_forwarded_at_once(launch: Callable[..., Run], tmp_path: Path) -> None:
    """Ctrl-C twice: whoever repeats the stop does not wait out the grace."""
    command, log = signal_trainer(tmp_path)
    run = launch(command)
    run.go(stop_grace=600.0)
    wait_until("trainer ready", Path(str(log) + ".ready").exists)
    run.proc.send_signal(signal.SIGINT)
    wait_until("soft stop received", lambda: "SIGUSR1" in received(log))
    run.proc.send_signal(signal.SIGTERM)
    record = run.finish()
    assert received(log) == ["SIGUSR1"]
    assert (record.signals_deferred, record.signals_forwarded) == (("SIGINT",), ("SIGTERM",))
    assert record.signal == signal.SIGTERM


def test_exit_code_passes_through_and_group_survivors_are_killed(
    launch: Callable[..., Run], tmp_path: Path
) -> None:
    marker = tmp_path / "leftover.pid"
    script = (
        "import subprocess, sys\n"
        "p = subprocess.Popen(['sleep', '3600'])\n"
        f"open({str(marker)!r}, 'w').write(str(p.pid))\n"
        "sys.exit(3)\n"
    )
    run = launch([sys.executable, "-c", script])
    run.go(kill_grace=2.0)
    record = run.finish()
    assert record.exit_code == 3 and record.returncode == 3 and record.reason == "exited"
    leftover = int(marker.read_text())
    assert [(p.pid, p.command) for p in record.survivors_killed] == [(leftover, ("sleep", "3600"))]
    assert not record.kill_sent, "sleep dies on TERM: no KILL needed"
    assert gone(leftover)


def leaving_a_child(marker: Path, child: list[str]) -> list[str]:
    """A trainer that starts ``child``, writes its PID to ``marker`` and exits 0 at once."""
    script = (
        f"import subprocess\np = subprocess.Popen({child!r})\nopen({str(marker)!r}, 'w').write(str(p.pid))\n"
    )
    return [sys.executable, "-c", script]


def test_a_child_that_exits_by_itself_within_the_exit_grace_is_no_survivor(
    launch: Callable[..., Run], tmp_path: Path
) -> None:
    """Lightning's launcher: rank 1, a child of rank 0, is still exiting when rank 0 ends."""
    marker = tmp_path / "child.pid"
    run = launch(leaving_a_child(marker, [sys.executable, "-c", "import time; time.sleep(1)"]))
    run.go(exit_grace=5.0)
    record = run.finish()
    assert record.exit_code == 0 and record.reason == "exited"
    assert record.survivors_killed == () and not record.kill_sent and record.unreaped == ()
    assert gone(int(marker.read_text()))


def test_a_child_still_running_after_the_exit_grace_is_killed_as_a_survivor(
    launch: Callable[..., Run], tmp_path: Path
) -> None:
    marker = tmp_path / "child.pid"
    run = launch(leaving_a_child(marker, ["sleep", "3600"]))
    run.go(exit_grace=1.0)
    record = run.finish()
    child = int(marker.read_text())
    assert record.exit_code == 0 and record.reason == "exited" and not record.deadline_expired
    assert [(p.pid, p.command) for p in record.survivors_killed] == [(child, ("sleep", "3600"))]
    assert gone(child)


def test_the_exit_grace_ends_at_the_deadline(launch: Callable[..., Run], tmp_path: Path) -> None:
    marker = tmp_path / "child.pid"
    run = launch(leaving_a_child(marker, ["sleep", "3600"]))
    run.go(deadline_in=3.0, margin=2.0, term_grace=1.0, exit_grace=60.0)
    record = run.finish(timeout_s=20.0)  # far less than the grace
    child = int(marker.read_text())
    assert record.reason == "exited" and [(p.pid, p.command) for p in record.survivors_killed] == [
        (child, ("sleep", "3600"))
    ]


def test_the_exit_grace_ends_at_the_deadlines_term_so_a_leak_stays_a_leak(
    launch: Callable[..., Run], tmp_path: Path
) -> None:
    """A trainer that exits on its own shortly before the deadline: its survivor is TERMed no later
    than the deadline's TERM would have been, and dies of it, a leak; it is never left running
    into the deadline, whose KILL would make the run look ended by the deadline."""
    marker = tmp_path / "child.pid"
    run = launch(leaving_a_child(marker, ["sleep", "3600"]))
    run.go(deadline_in=6.0, margin=5.0, term_grace=4.0, kill_grace=3.0, exit_grace=60.0)
    record = run.finish(timeout_s=20.0)
    child = int(marker.read_text())
    assert record.reason == "exited" and not record.deadline_expired and not record.kill_sent
    assert [(p.pid, p.command) for p in record.survivors_killed] == [(child, ("sleep", "3600"))]
    assert gone(child)


def test_the_sidecars_stop_request_ends_the_exit_grace(launch: Callable[..., Run], tmp_path: Path) -> None:
    """The supervision loop is over once the trainer exited: the grace itself still hears the
    sidecar's stop (a Ctrl-C of the soak), and the survivor is TERMed then, not after the grace."""
    marker = tmp_path / "child.pid"
    run = launch(leaving_a_child(marker, ["sleep", "3600"]))
    run.go(exit_grace=60.0)
    wait_until("the trainer's child started", marker.exists)
    wait_until("the trainer reaped", lambda: (info := run.rd.trainer()) is not None and gone(info.pid))
    asked = time.monotonic()
    run.rd.request("terminate", "soak was interrupted")
    record = run.finish(timeout_s=20.0)
    assert time.monotonic() - asked < 10.0  # far less than the grace
    assert [(a.action, a.reason) for a in record.control] == [("terminate", "soak was interrupted")]
    assert [p.pid for p in record.survivors_killed] == [int(marker.read_text())]


def test_a_zombie_leader_the_trainer_left_is_killed_and_named(
    launch: Callable[..., Run], tmp_path: Path, zombie_leader: Path
) -> None:
    """A daemon whose leader thread left (/proc/PID says Z while its thread runs) is alive: the
    subreaper's cleanup kills it and names it, rather than leave it to outlive the run."""
    marker = tmp_path / "leader.pid"
    script = (
        "import subprocess, sys\n"
        f"p = subprocess.Popen([{str(zombie_leader)!r}, '8', '4'], stdout=subprocess.PIPE,\n"
        "                      start_new_session=True)\n"
        f"open({str(marker)!r}, 'w').write(p.stdout.readline().split()[1].decode())\n"
    )
    run = launch([sys.executable, "-c", script])
    run.go(kill_grace=2.0)
    record = run.finish()
    leader = int(marker.read_text())
    assert [(p.pid, p.command) for p in record.survivors_killed] == [(leader, (str(zombie_leader), "8", "4"))]
    assert live_thread(leader) is None  # psutil would call it a zombie, gone or not


def test_control_soft_stop_then_terminate_escalates_to_kill(
    launch: Callable[..., Run], tmp_path: Path
) -> None:
    command, log = signal_trainer(tmp_path, "ignore-term")
    run = launch(command)
    run.go(kill_grace=0.5, soft_stop_signal="SIGUSR2")
    wait_until("trainer ready", Path(str(log) + ".ready").exists)
    run.rd.request("soft_stop", "operator asked")
    wait_until("SIGUSR2 received", lambda: "SIGUSR2" in received(log))
    soft = soft_stop_record(run.rd.path)
    assert soft is not None and soft.reason == "control: operator asked"
    run.rd.request("terminate", "stale progress")
    record = run.finish()
    assert record.reason == "control"
    assert [(c.seq, c.action) for c in record.control] == [(1, "soft_stop"), (2, "terminate")]
    assert record.term_sent and record.kill_sent
    assert record.exit_code == 128 + signal.SIGKILL
    assert received(log) == ["SIGUSR2"]


def test_control_kill_and_stale_requests_ignored(launch: Callable[..., Run], tmp_path: Path) -> None:
    command, log = signal_trainer(tmp_path)
    run = launch(command)
    run.go()
    wait_until("trainer ready", Path(str(log) + ".ready").exists)
    # A request for another launcher (stale file of an earlier run) must not act.
    atomic_write_json(
        str(run.rd.file(proto.CONTROL_FILE)),
        {"protocol": 1, "launch_id": "someone-else", "seq": 99, "action": "kill", "reason": "x"},
    )
    # Handshake, not a while: the turn whose wait sees control.json change reads it in the next
    # turn, so two complete turns after the write it has been read (and the trainer would be dead).
    loop_turns(run, log, 3)
    assert run.proc.poll() is None and run.rd.read_exit() is None
    run.rd.request("kill", "verdict already known")
    record = run.finish()
    assert record.reason == "control" and record.kill_sent and not record.term_sent
    assert record.signal == signal.SIGKILL
    assert [(c.seq, c.action) for c in record.control] == [(1, "kill")], "the stale seq 99 never acted"


def test_console_log_is_bounded_and_output_teed(launch: Callable[..., Run], tmp_path: Path) -> None:
    lines = 20000
    script = (
        "import sys\n"
        f"for i in range({lines}):\n"
        "    sys.stdout.write(f'line {i:06d} ' + 'x' * 20 + '\\n')\n"
        "sys.stderr.write('to stderr\\n')\n"
    )
    run = launch([sys.executable, "-c", script])
    cap = 64 * 1024
    run.go(cap=cap)
    record = run.finish()
    assert record.exit_code == 0
    teed = run.stdout.read_bytes()
    assert teed.count(b"\n") == lines + 1 and teed.endswith(b"to stderr\n")
    logs = run.rd.console_logs()
    assert [p.name for p in logs] == ["console.log.1", "console.log"]
    kept = b"".join(p.read_bytes() for p in logs)
    assert len(kept) <= cap
    assert len(kept) >= cap // 2
    assert teed.endswith(kept), "the log holds the most recent output, contiguous"


def test_abort_before_and_after_announce(launch: Callable[..., Run], tmp_path: Path, spawn: Spawner) -> None:
    run = launch(["true"])
    run.rd.wait_for_launcher(30)
    run.rd.abort("approval missing", 15)
    record = run.finish()
    assert record.reason == "aborted" and record.exit_code == 15 and not record.trainer_started
    assert run.rd.trainer() is None

    # Unbound abort written before any launcher exists applies to the next one.
    rd = RunDir(tmp_path / "run2")
    rd.reset()
    rd.abort("identity mismatch", 21)
    proc = spawn([sys.executable, str(launcher_path()), "--run-dir", str(rd.path), "--", "true"])
    assert proc.wait(timeout=30) == 21
    late = rd.read_exit()
    assert late is not None and late.reason == "aborted"


def test_go_timeout_ignores_a_stale_go(launch: Callable[..., Run], tmp_path: Path) -> None:
    run = launch(["true"], "--go-timeout", "1.0")
    run.rd.wait_for_launcher(30)
    atomic_write_json(
        str(run.rd.file(proto.GO_FILE)),
        {
            "protocol": 1,
            "launch_id": "an-earlier-launcher",
            "deadline_unix": time.time() + 100,
            "checkpoint_margin_s": 1,
            "term_grace_s": 1,
            "heartbeat_timeout_s": 10,
        },
    )
    record = run.finish()
    assert record.reason == "go_timeout" and record.exit_code == proto.EXIT_GO_TIMEOUT
    assert not record.trainer_started


def test_refuses_inside_the_margin_and_reports_spawn_failure(
    launch: Callable[..., Run], tmp_path: Path
) -> None:
    run = launch(["true"])
    run.go(deadline_in=5.0, margin=10.0)
    record = run.finish()
    assert record.reason == "insufficient_budget"
    assert record.exit_code == proto.EXIT_INSUFFICIENT_BUDGET and not record.trainer_started

    run = launch([str(tmp_path / "no-such-trainer")])
    run.go()
    record = run.finish()
    assert record.reason == "spawn_failed" and record.exit_code == proto.EXIT_NOT_FOUND


def test_trainer_environment_and_records(launch: Callable[..., Run], tmp_path: Path) -> None:
    script = (
        "import json, os\n"
        "keys = ['SOAK_DEADLINE_FILE', 'SOAK_SOFT_STOP_FILE', 'SOAK_RUN_DIR', 'SOAK_DEADLINE_UNIX',"
        " 'SOAK_RUN_ID', 'SOAK_SOFT_STOP_SIGNAL']\n"
        "env = {k: os.environ.get(k) for k in keys}\n"
        "env['copy'] = json.load(open(os.environ['SOAK_DEADLINE_FILE']))\n"
        "print(json.dumps(env))\n"
    )
    run = launch([sys.executable, "-c", script])
    deadline = run.go()
    record = run.finish()
    assert record.exit_code == 0
    env = json.loads(run.stdout.read_text())
    assert env["SOAK_DEADLINE_FILE"] == str(run.rd.file(proto.DEADLINE_COPY_FILE))
    assert env["SOAK_SOFT_STOP_FILE"] == str(run.rd.file(proto.SOFT_STOP_FILE))
    assert env["SOAK_RUN_DIR"] == str(run.rd.path)
    assert float(env["SOAK_DEADLINE_UNIX"]) == deadline
    assert env["SOAK_RUN_ID"] == "6d1f3a52-2f0e-4c59-9d3e-2b1f0c1d2e3f"
    assert env["SOAK_SOFT_STOP_SIGNAL"] == "SIGUSR1"
    assert env["copy"]["deadline_unix"] == deadline
    assert env["copy"]["soft_stop_unix"] == deadline - 10.0
    info = run.rd.launcher()
    trainer = run.rd.trainer()
    assert info is not None and info.subreaper and info.pid == run.proc.pid
    assert trainer is not None and trainer.pid == trainer.pgid == record.trainer_pid


@pytest.mark.parametrize("mode", ["heartbeat", "owner"])
def test_losing_the_sidecar_kills_the_trainer(mode: str, tmp_path: Path, spawn: Spawner) -> None:
    """SIGKILL the sidecar stand-in: heartbeat staleness (or owner loss) kills the trainer."""
    command, log = signal_trainer(tmp_path, "ignore-term", "child")
    run_dir = tmp_path / "run"
    rd = RunDir(run_dir)
    rd.reset()
    driver_py = tmp_path / "driver.py"
    driver_py.write_text(HEARTBEAT_DRIVER)
    hb_timeout = 2.0 if mode == "heartbeat" else 120.0
    driver = spawn([sys.executable, str(driver_py), str(run_dir), str(hb_timeout), mode, *command])
    launcher_proc: subprocess.Popen[bytes] | None = None
    if mode == "heartbeat":
        launcher_proc = spawn(
            [sys.executable, str(launcher_path()), "--run-dir", str(run_dir), "--", *command]
        )
    ready = Path(str(log) + ".ready")
    wait_until("trainer ready", ready.exists)
    trainer_pid = int(ready.read_text())
    child_pid = int(Path(str(log) + ".child").read_text())
    info = rd.wait_for_launcher(5)
    # In owner mode the driver's child: once the driver is killed, nobody here can reap it.
    launcher = psutil.Process(info.pid)
    try:
        beats = last_beat(rd).get("seq", 0)
        wait_until("three beats since the trainer started", lambda: last_beat(rd).get("seq", 0) >= beats + 3)
        killed_at = time.time()
        driver.kill()
        driver.wait(timeout=10)
        record = rd.wait_exit(30)
        assert record is not None
        if mode == "heartbeat":
            assert record.reason == "heartbeat_lost" and record.heartbeat_lost
            assert launcher_proc is not None and launcher_proc.wait(timeout=10) == 125
            # Last beat was at most one interval (0.2 s) before the kill.
            assert record.ended_unix is not None
            assert hb_timeout - 0.3 <= record.ended_unix - killed_at <= hb_timeout + 2.0
        else:
            assert record.reason == "owner_lost" and record.owner_lost
            assert record.ended_unix is not None and record.ended_unix - killed_at < 2.0
        assert record.exit_code == proto.EXIT_SUPERVISOR_LOST and record.kill_sent
        wait_until("trainer and child gone", lambda: gone(trainer_pid) and gone(child_pid), 10)
    finally:
        kill_orphan(launcher)


def test_heartbeat_keeps_the_trainer_alive(launch: Callable[..., Run], tmp_path: Path) -> None:
    command, log = signal_trainer(tmp_path)
    run = launch(command)
    run.rd.wait_for_launcher(30)
    with Heartbeat(run.rd, 0.2) as beat:
        run.go(hb_timeout=1.0)
        wait_until("trainer ready", Path(str(log) + ".ready").exists)
        ready_at = time.time()
        # Beats go on for 2.5x the timeout; then one complete turn of the launcher's loop, heartbeat
        # enforcement included, and the trainer still gets the next signal.
        wait_until("a beat 2.5 s after ready", lambda: last_beat(run.rd).get("wall", 0) >= ready_at + 2.5)
        loop_turns(run, log, 2)
        assert run.proc.poll() is None, "beating sidecar: trainer must survive 2.5x the timeout"
        assert beat.beats >= 5 and beat.unwritten == []
    record = run.finish(timeout_s=15)
    assert record.reason == "heartbeat_lost"


def test_runs_under_the_minimum_python(launch: Callable[..., Run], tmp_path: Path) -> None:
    """The built launcher runs under the trainer image's interpreter, which may be as old as
    MIN_PYTHON, isolated from its environment and site-packages (-I -S): the standard library only,
    through the whole handshake (ready, go, soft stop, TERM, KILL, exit.json)."""
    python = str(require("launcher-python"))
    command, log = signal_trainer(tmp_path, "ignore-term", "child")
    run = launch(command, python=(python, "-I", "-S"))
    run.go(deadline_in=3.0, margin=2.0, term_grace=1.0)
    record = run.finish()
    info = run.rd.launcher()
    version = ".".join(map(str, proto.MIN_PYTHON))
    assert info is not None and info.python_version.startswith(f"{version}."), info
    assert record.reason == "deadline" and record.exit_code == 128 + signal.SIGKILL
    assert received(log) == ["SIGUSR1"] and record.killed_with_trainer


# A trainer that floods its output (numbered lines, far more than a pipe holds), announces that it
# is done writing, then lingers ignoring the soft-stop signal and TERM: only a KILL ends it.
FLOOD_TRAINER = """
import os, signal, sys, time
ready, lines = sys.argv[1], int(sys.argv[2])
signal.signal(signal.SIGUSR1, signal.SIG_IGN)
signal.signal(signal.SIGTERM, signal.SIG_IGN)
out = sys.stdout.buffer
for i in range(lines):
    out.write(b"flood %07d " % i + b"y" * 48 + b"\\n")
out.flush()
with open(ready, "w") as fh:
    fh.write(str(os.getpid()))
time.sleep(600)
"""

FLOOD_LINES = 80_000  # 64 bytes a line: 5 MB, far over the pipe buffer and the tee's queue

# The owner for the stalled-stdout test: starts the launcher with --owner-pid = itself and its own
# stdout (the test's unread pipe), then just waits to be killed.
OWNER_DRIVER = """
import os, subprocess, sys, time
launcher, run_dir, trainer = sys.argv[1], sys.argv[2], sys.argv[3:]
subprocess.Popen([sys.executable, launcher, "--run-dir", run_dir, "--owner-pid", str(os.getpid()),
                  "--", *trainer], start_new_session=True)
time.sleep(600)
"""

DROP_NOTE = re.compile(
    rb"\[soak-launcher\] (\d+) bytes of trainer output not shown \(stdout reader too slow\)"
)


def _flood_output() -> bytes:
    return b"".join(b"flood %07d " % i + b"y" * 48 + b"\n" for i in range(FLOOD_LINES))


@pytest.mark.parametrize(
    ("trigger", "stderr_too"),
    [("deadline", False), ("owner", False), ("control", False), ("owner", True)],
    ids=["deadline", "owner", "control", "owner-stderr-too"],
)
def test_a_stalled_stdout_reader_cannot_stall_the_event_loop(
    trigger: str, stderr_too: bool, tmp_path: Path, spawn: Spawner
) -> None:
    """The launcher's stdout is a pipe nobody reads (a `| less` left alone, a stuck reader): the
    tee to it must not block the loop, so deadline KILL, owner loss and control still act in time;
    console.log keeps everything, stdout gets what fits and the rest is counted as dropped.
    stderr_too: `2>&1 | less`, the launcher's own messages go to the same stalled pipe."""
    rd = RunDir(tmp_path / "run")
    rd.reset()
    read_end, write_end = os.pipe()  # the read end stays open and is never read until the end
    launcher: psutil.Process | None = None
    try:
        started = _start_flooded_launcher(
            spawn, trigger, rd, tmp_path, stdout=write_end, stderr_too=stderr_too
        )
        info = rd.wait_for_launcher(30, alive=lambda: started.poll() is None)
        # For trigger owner, OWNER_DRIVER's child: once the driver is killed, nobody here can reap it.
        launcher = psutil.Process(info.pid)
        record = _stop_while_stdout_stalls(trigger, rd, started, tmp_path / "flood.ready")
        if trigger != "owner":
            assert started.wait(timeout=5) == record.exit_code
        # It exits too: flushing to the stalled pipe is bounded, and so is interpreter shutdown
        # with a writer thread still blocked in write().
        wait_until("launcher gone", lambda: gone(info.pid), timeout_s=5)

        assert (tmp_path / "flood.ready").exists(), "the trainer got to write all its output"
        assert os.get_blocking(write_end), "the launcher must not set O_NONBLOCK on its stdout"
        _check_every_byte_kept_or_counted(rd, read_end, tmp_path / "launcher.stderr", stderr_too)
    finally:
        if launcher is not None:
            kill_orphan(launcher)
        os.close(read_end)
        os.close(write_end)


def _start_flooded_launcher(
    spawn: Spawner, trigger: str, rd: RunDir, tmp_path: Path, *, stdout: int, stderr_too: bool
) -> subprocess.Popen[bytes]:
    """The launcher running the flooding trainer with ``stdout``; for trigger owner, under
    OWNER_DRIVER (the process returned), else directly."""
    script = tmp_path / "flood.py"
    script.write_text(FLOOD_TRAINER)
    command = [sys.executable, str(script), str(tmp_path / "flood.ready"), str(FLOOD_LINES)]
    if trigger == "owner":
        driver_py = tmp_path / "owner.py"
        driver_py.write_text(OWNER_DRIVER)
        argv = [sys.executable, str(driver_py), str(launcher_path()), str(rd.path), *command]
    else:
        argv = [sys.executable, str(launcher_path()), "--run-dir", str(rd.path), "--", *command]
    with (tmp_path / "launcher.stderr").open("wb") as err:
        stderr: int | IO[bytes] = stdout if stderr_too else err
        return spawn(argv, stdout=stdout, stderr=stderr)


def _stop_while_stdout_stalls(
    trigger: str, rd: RunDir, started: subprocess.Popen[bytes], ready: Path
) -> ExitRecord:
    """Give the go, let the trainer flood, then stop it by ``trigger``: the launcher must act in
    time, with the right reason, and the trainer must be gone."""
    deadline_in = 4.0 if trigger == "deadline" else 300.0
    deadline = time.time() + deadline_in
    rd.give_go(
        GoRequest(
            launch_id=str(rd.launch_id),
            deadline_unix=deadline,
            checkpoint_margin_s=2.0,
            term_grace_s=1.0,
            heartbeat_timeout_s=300.0,
            kill_grace_s=1.0,
            console_log_bytes=64 << 20,  # no rotation: console.log must hold every byte
        )
    )
    # The trainer writes everything only if the launcher keeps reading its pipe.
    with contextlib.suppress(TimeoutError):  # then the caller's check says what went wrong
        wait_until("trainer ready", ready.exists, timeout_s=15)
    trainer = rd.trainer()
    assert trainer is not None
    acted_at = time.time()
    if trigger == "owner":
        started.kill()
        started.wait(timeout=10)
    elif trigger == "control":
        rd.request("kill", "stalled stdout test")
    else:
        acted_at = deadline
    record = rd.wait_exit(max(0.0, acted_at - time.time()) + 5.0)
    assert record is not None, f"{trigger}: the launcher did not act with its stdout stalled"
    assert record.ended_unix is not None and record.ended_unix - acted_at < 4.0
    expected_reason = {"deadline": "deadline", "owner": "owner_lost", "control": "control"}
    assert record.reason == expected_reason[trigger] and record.kill_sent
    wait_until("trainer gone", lambda: gone(trainer.pid), timeout_s=5)
    return record


def _check_every_byte_kept_or_counted(rd: RunDir, read_end: int, stderr_path: Path, stderr_too: bool) -> None:
    output = _flood_output()
    assert [p.name for p in rd.console_logs()] == ["console.log"]
    assert rd.file(proto.CONSOLE_LOG).read_bytes() == output, "console.log keeps everything"
    raw = json.loads(rd.file(proto.EXIT_FILE).read_text())
    dropped = raw["stdout_dropped_bytes"]
    assert ExitRecord.parse(raw).stdout_dropped_bytes == dropped
    if stderr_too:
        assert 0 < dropped < len(output)
        return
    os.set_blocking(read_end, False)
    shown = b""
    with contextlib.suppress(BlockingIOError):
        while chunk := os.read(read_end, 1 << 16):
            shown += chunk
    assert shown and output.startswith(shown), "stdout got an in-order prefix, then nothing"
    assert len(shown) + dropped == len(output), "every byte is shown or counted as dropped"
    notes = [int(n) for n in DROP_NOTE.findall(stderr_path.read_bytes())]
    assert notes and sum(notes) == dropped, "the drop notes on stderr add up to the count"


# An agent like torchrun's: a TERM handler but none for the soft-stop signal, and two workers each
# started in a session of its own (start_new_session=True). A worker writes "<signal> <rank>" to
# its log when a signal arrives and, on SIGUSR1 or SIGTERM, checkpoints and exits 0; the agent
# exits when they did.
AGENT_TRAINER = """
import os, signal, subprocess, sys, time
log = sys.argv[1]
WORKER = '''
import os, signal, sys, time
log, rank = sys.argv[1], sys.argv[2]
def stop(signum, frame):
    with open(log, "a") as fh:
        fh.write(f"{signal.Signals(signum).name} {rank}\\\\n")
    with open(log + ".ckpt-" + rank, "w") as fh:
        fh.write("step")
    sys.exit(0)
signal.signal(signal.SIGUSR1, stop)
signal.signal(signal.SIGTERM, stop)
with open(log + ".ready-" + rank, "w") as fh:
    fh.write(str(os.getpid()))
while True:
    time.sleep(0.05)
'''
# Like torchrun's agent: a TERM is noted, and it goes on waiting for its workers.
signal.signal(signal.SIGTERM, lambda signum, frame: None)
workers = [subprocess.Popen([sys.executable, "-c", WORKER, log, str(rank)], start_new_session=True)
           for rank in (0, 1)]
codes = [w.wait() for w in workers]
sys.exit(max(codes))
"""


def agent_trainer(tmp_path: Path) -> tuple[list[str], Path]:
    script = tmp_path / "agent.py"
    script.write_text(AGENT_TRAINER)
    return [sys.executable, str(script), str(tmp_path / "workers.log")], tmp_path / "workers.log"


def workers_ready(log: Path) -> bool:
    return all(Path(f"{log}.ready-{rank}").exists() for rank in (0, 1))


def test_the_soft_stop_reaches_every_worker_that_catches_it_and_spares_the_agent(
    launch: Callable[..., Run], tmp_path: Path
) -> None:
    command, log = agent_trainer(tmp_path)
    run = launch(command)
    run.go(deadline_in=6.0, margin=4.0, term_grace=1.0)
    wait_until("workers ready", lambda: workers_ready(log))
    record = run.finish()
    # Both workers, each in its own session, checkpointed on SIGUSR1; the agent, which has no
    # handler and would have died of it (-10), was not signalled and exited 0 after them.
    assert sorted(received(log)) == ["SIGUSR1", "SIGUSR1"]
    assert all(Path(f"{log}.ckpt-{rank}").read_text() == "step" for rank in (0, 1))
    assert record.reason == "exited" and record.returncode == 0 and record.soft_stop_sent
    assert not record.term_sent and not record.kill_sent
    workers = {int(Path(f"{log}.ready-{rank}").read_text()) for rank in (0, 1)}
    exit_json = json.loads(run.rd.file(proto.EXIT_FILE).read_text())
    assert set(exit_json["soft_stop_signalled"]) == workers


def test_term_at_the_deadline_reaches_workers_in_other_sessions(
    launch: Callable[..., Run], tmp_path: Path
) -> None:
    command, log = agent_trainer(tmp_path)
    run = launch(command)
    # Soft stop by another signal nobody catches: only the deadline's TERM can stop the workers.
    run.go(deadline_in=4.0, margin=3.0, term_grace=2.0, soft_stop_signal="SIGUSR2")
    wait_until("workers ready", lambda: workers_ready(log))
    record = run.finish()
    assert sorted(received(log)) == ["SIGTERM", "SIGTERM"]  # not KILLed at the deadline instead
    assert record.term_sent and not record.kill_sent and record.returncode == 0
    exit_json = json.loads(run.rd.file(proto.EXIT_FILE).read_text())
    assert exit_json["soft_stop_signalled"] == []  # SIGUSR2 would have killed all three
