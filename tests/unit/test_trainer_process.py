"""The trainer is what the sidecar saw (the launcher's oldest child), never what trainer.json says."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from sidecar.core.samples import ProcessInfo
from sidecar.core.trainer_process import claim_mismatch, launcher_stopped, trainer_of

LAUNCHER = 50


def proc(pid: int, ppid: int, ticks: int | None) -> ProcessInfo:
    return ProcessInfo(
        pid=pid, ppid=ppid, start_time=0.0, start_ticks=ticks, rss_kib=1, fd_count=1, fd_classes={},
        threads=1, state="sleeping", command="x",
    )  # fmt: skip


def test_the_oldest_child_of_the_launcher_is_the_trainer_not_an_adopted_orphan() -> None:
    tree = [proc(LAUNCHER, 1, 10), proc(70, LAUNCHER, 30), proc(60, LAUNCHER, 20), proc(61, 60, 21)]
    assert trainer_of(tree, LAUNCHER) == tree[2]
    assert trainer_of([proc(LAUNCHER, 1, 10)], LAUNCHER) is None


def test_a_claim_that_names_another_process_is_a_mismatch() -> None:
    trainer = proc(60, LAUNCHER, 20)
    assert claim_mismatch(60, 20, trainer) is None
    assert claim_mismatch(60, None, trainer) is None
    assert claim_mismatch(1, None, trainer) is not None
    assert claim_mismatch(60, 21, trainer) is not None


processes = st.builds(
    proc,
    pid=st.integers(-5, 200),
    ppid=st.integers(-5, 200),
    ticks=st.one_of(st.none(), st.integers(0, 10**12)),
)


@given(st.lists(processes, max_size=30), st.integers(-5, 200))
def test_whatever_the_tree_the_trainer_is_a_child_of_the_launcher_and_never_pid_1(
    tree: list[ProcessInfo], launcher: int
) -> None:
    found = trainer_of(tree, launcher)
    if found is not None:
        assert found in tree and found.ppid == launcher and found.pid > 1 and found.start_ticks is not None
        assert all(found.start_ticks <= (p.start_ticks or 0) for p in tree if p.ppid == launcher and p.pid > 1
                   and p.start_ticks is not None)  # fmt: skip


def test_a_launcher_seen_stopped_or_traced_is_named_and_a_stopped_trainer_is_not() -> None:
    def launcher_in(state: str) -> list[ProcessInfo]:
        return [proc(LAUNCHER, 1, 10).model_copy(update={"state": state}), proc(60, LAUNCHER, 20)]

    for state in ("stopped", "tracing-stop"):
        found = launcher_stopped(launcher_in(state), LAUNCHER, 4.04)
        assert found == f"the launcher (pid {LAUNCHER}) was seen {state} 4.0 s into the attempt: " + (
            "stopped or traced from the trainer's side"
        )
    assert launcher_stopped(launcher_in("sleeping"), LAUNCHER, 4.0) is None
    assert launcher_stopped(launcher_in("zombie"), LAUNCHER, 4.0) is None
    stopped_trainer = [proc(LAUNCHER, 1, 10), proc(60, LAUNCHER, 20).model_copy(update={"state": "stopped"})]
    assert launcher_stopped(stopped_trainer, LAUNCHER, 4.0) is None  # a debugger's, or the trainer's own
    assert launcher_stopped([], LAUNCHER, 4.0) is None
