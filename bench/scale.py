"""Many sidecars of one soak against one bucket: N indexes starting at once, then ending at once.

Starts SeaweedFS on 127.0.0.1 (the test fixture's context manager) and, for each N, runs N
sidecars' store clients, each with its own S3 clients, as the sidecar builds them
(``S3DeadlineStore``, ``S3LedgerStore``). Released together, each does what a sidecar does against
the bucket before its trainer starts: take its index's lock, create or resume the run's one
deadline record (reading the attempt claims first), read the server's clock and claim its attempt.
Once every index holds its lock, all add their attempt to the run's ledger at once (the moment a
soak's deadline ends every index together). One machine cannot hold 1,024 sidecars: the clients
run as threads spread over ``--procs`` processes, one client set per thread (the
clients of a process share one boto3 session, as the S3 model it loads is the same).

Prints per N: seconds until every index held its lock on one record, refusals (must be 0),
S3 requests per index (HTTP attempts, botocore's retries included) and the answers by status
(412/409/503), then the ledger phase's wall time, requests and losses, and the leases that were not
renewed in time while held (``leases``: lost locks, which stop a trainer). The baseline, measured in
the same run, is one sidecar alone doing the same (its requests and time are what N sidecars
would cost with no one else on the bucket).

    python bench/scale.py [--indexes 64 256 1024] [--procs 8] [--smoke]

``--smoke``: 4 and 8 indexes in 2 processes, a check that the benchmark still runs.
"""

from __future__ import annotations

import argparse
import collections
import multiprocessing
import statistics
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from sidecar.adapters.ledger_store import S3LedgerStore
from sidecar.adapters.s3_client import make_s3_client
from sidecar.adapters.s3_store import S3DeadlineStore
from sidecar.adapters.s3_store.lease import SystemClock
from sidecar.core.deadline import obtain_record
from sidecar.core.identity import make_identity, run_slot
from sidecar.core.ledger.phases import PHASES, Phase
from sidecar.core.ledger.record import Ledger, LedgerEntry, with_entry
from sidecar.settings import S3Settings
from tests.fixtures.s3 import SeaweedServer, run_seaweedfs

BUDGET_S = 72 * 3600.0
WAIT_S = 600.0


@dataclass
class Outcome:
    """What one sidecar saw: its times (monotonic, shared by every process on the machine)."""

    index: int
    released: float = 0.0
    ready: float | None = None
    ledger_s: float | None = None
    record: tuple[Any, ...] | None = None
    error: str | None = None
    ledger_error: str | None = None
    lease_lost: bool = False  # not renewed within lock_lease_s while held (the machine's CPUs or the server)
    start_requests: int = 0
    ledger_requests: int = 0
    statuses: collections.Counter[str] = field(default_factory=collections.Counter)


class Answers:
    """Every HTTP attempt a client sends and what came back, through botocore's own retry hook."""

    def __init__(self, outcome: Outcome) -> None:
        self.outcome, self.sent = outcome, 0

    def attach(self, client: Any) -> None:
        client.meta.events.register("needs-retry.s3", self._answered)

    def _answered(self, response: Any = None, caught_exception: Any = None, **_: Any) -> None:
        self.sent += 1
        if response is not None:
            self.outcome.statuses[str(response[0].status_code)] += 1
        else:
            self.outcome.statuses[type(caught_exception).__name__] += 1


def _entry(index: int, attempt: int, started: float) -> LedgerEntry:
    phases, at = [], started
    for kind in PHASES:
        seconds = 3000.0 if kind == "productive" else 20.0
        phases.append(Phase(kind, at, at + seconds))
        at += seconds
    return LedgerEntry(
        attempt=attempt,
        index=index,
        status="failed",
        classification="deadline",
        start=started,
        end=at,
        phases=tuple(phases),
        artifact=f"s3://soak-test/scale/{index}-{attempt}/artifact.json",
    )


STAGES = ("built", "locked", "written")


class Stages:
    """A worker process's threads and the parent in step: each thread says when it is through a
    stage, the process tells the parent once all are, and the parent's go opens the next stage in
    every process at once (a pipe per process, no condition variable shared by 1,024 waiters)."""

    def __init__(self, threads: int, conn: Any) -> None:
        self._threads, self._conn = threads, conn
        self._through: collections.Counter[str] = collections.Counter()
        self._changed = threading.Condition()
        self._go = {stage: threading.Event() for stage in STAGES}

    def through(self, stage: str) -> None:
        with self._changed:
            self._through[stage] += 1
            self._changed.notify_all()

    def wait(self, stage: str) -> None:
        if not self._go[stage].wait(WAIT_S):
            raise TimeoutError(f"no go after stage {stage}")

    def _all_through(self, stage: str) -> bool:
        return self._through[stage] >= self._threads

    def relay(self) -> None:
        for stage in STAGES:
            with self._changed:
                self._changed.wait_for(partial(self._all_through, stage), WAIT_S)
            self._conn.send(stage)
            self._conn.recv()
            self._go[stage].set()


@dataclass
class Sidecar:
    """One sidecar's store clients, each with its own S3 client."""

    index: int
    out: Outcome
    answers: Answers
    store: S3DeadlineStore
    ledger: S3LedgerStore


def _build(settings: S3Settings, session: Any, index: int) -> Sidecar:
    """Built in the process's main thread: a boto3 session is not thread-safe, and one session per
    process shares the loaded S3 model between its clients (a session each would need about
    10 MiB per client: 20 GiB for 1,024 sidecars)."""
    out = Outcome(index)
    answers = Answers(out)

    def factory(s3: S3Settings) -> Any:
        client = make_s3_client(s3, session=session)
        answers.attach(client)
        return client

    return Sidecar(
        index,
        out,
        answers,
        S3DeadlineStore(
            settings, client_factory=factory, on_lock_lost=lambda _: setattr(out, "lease_lost", True)
        ),
        S3LedgerStore(settings, SystemClock(), client_factory=factory),
    )


def _sidecar(sidecar: Sidecar, run_id: str, stages: Stages) -> None:
    out = sidecar.out
    passed: list[str] = []

    def through(stage: str) -> None:
        passed.append(stage)
        stages.through(stage)
        stages.wait(stage)

    try:
        _steps(sidecar, run_id, through)
    except Exception as exc:  # a refusal or a store failure: counted; the others go on
        out.error = f"{type(exc).__name__}: {exc}"[:300]
        for stage in STAGES:
            if stage not in passed:
                stages.through(stage)


def _steps(sidecar: Sidecar, run_id: str, through: Any) -> None:
    out, answers, store, ledger, index = (
        sidecar.out,
        sidecar.answers,
        sidecar.store,
        sidecar.ledger,
        sidecar.index,
    )
    identity = make_identity(
        run_id=run_id,
        command=("python3", "train.py"),
        budget_s=BUDGET_S,
        checkpoint_margin_s=600.0,
        deadline_store=store.location,
    )
    slot = run_slot(run_id, index)
    through("built")
    out.released = time.monotonic()
    with store.lock(slot):
        record = obtain_record(
            store, identity, now_wall=time.time(), resume_required=False, max_budget_s=BUDGET_S
        ).record
        store.store_clock(run_id)
        attempt = store.claim_attempt(slot)
        out.ready, out.record = time.monotonic(), (record.started_unix, record.deadline_unix)
        out.start_requests = answers.sent
        through("locked")
        began = time.monotonic()
        entry = _entry(index, attempt, record.started_unix)

        def change(current: Ledger | None) -> Ledger:
            return with_entry(current, entry, run_id=run_id, deadline_started_unix=record.started_unix)

        try:
            ledger.update(run_id, f"scale/{run_id}/", change)
        except Exception as exc:  # a lost ledger write is counted, not a refusal
            out.ledger_error = f"{type(exc).__name__}: {exc}"[:300]
        out.ledger_s = time.monotonic() - began
        out.ledger_requests = answers.sent - out.start_requests
        through("written")


def _process(server: SeaweedServer, run_id: str, indexes: list[int], conn: Any, queue: Any) -> None:
    settings, session = server.settings(), server.session()
    sidecars = [_build(settings, session, index) for index in indexes]
    stages = Stages(len(indexes), conn)
    threads = [threading.Thread(target=_sidecar, args=(sidecar, run_id, stages)) for sidecar in sidecars]
    for thread in threads:
        thread.start()
    stages.relay()
    for thread in threads:
        thread.join()
    queue.put([sidecar.out for sidecar in sidecars])


def run_once(server: SeaweedServer, count: int, procs: int) -> list[Outcome]:
    """``count`` sidecars of one new run in ``procs`` processes; each one's outcome."""
    context = multiprocessing.get_context("fork")
    queue = context.Queue()
    run_id = str(uuid.uuid4())
    shares = [list(range(count))[p::procs] for p in range(min(procs, count))]
    pipes = [context.Pipe() for _ in shares]
    workers = [
        context.Process(target=_process, args=(server, run_id, share, child, queue))
        for share, (_, child) in zip(shares, pipes, strict=True)
    ]
    for worker in workers:
        worker.start()
    for stage in STAGES:  # every process through the stage, then all go on together
        for parent, _ in pipes:
            if not parent.poll(WAIT_S) or parent.recv() != stage:
                raise SystemExit(f"a worker never got through {stage}")
        for parent, _ in pipes:
            parent.send("go")
    outcomes: list[Outcome] = []
    for _ in workers:
        outcomes += queue.get(timeout=WAIT_S)
    for worker in workers:
        worker.join()
    return sorted(outcomes, key=lambda out: out.index)


def report(label: str, outcomes: list[Outcome], alone: Outcome | None) -> None:
    ok = [out for out in outcomes if out.error is None and out.ready is not None and out.ledger_s is not None]
    refused = [out for out in outcomes if out.error is not None]
    records = {out.record for out in outcomes if out.record is not None}
    statuses: collections.Counter[str] = collections.Counter()
    for out in outcomes:
        statuses.update(out.statuses)
    start = min(out.released for out in outcomes)
    all_ready = max((out.ready or start) for out in ok) - start if ok else float("nan")
    start_req = [out.start_requests for out in ok] or [0]
    ledger_req = [out.ledger_requests for out in ok] or [0]
    ledger_s = [out.ledger_s or 0.0 for out in ok] or [0.0]
    answered = ", ".join(f"{code}: {n}" for code, n in sorted(statuses.items()))
    print(
        f"{label:>8} {len(outcomes):>6} {all_ready:>9.2f} {len(refused):>8} {len(records):>8} "
        f"{statistics.mean(start_req):>8.1f} {max(start_req):>6} "
        f"{max(ledger_s):>9.2f} {statistics.mean(ledger_req):>8.1f} {max(ledger_req):>6} "
        f"{sum(out.lease_lost for out in outcomes):>6}   {answered}"
    )
    for out in refused[:3]:
        print(f"         index {out.index} refused: {out.error}")
    lost = [out for out in outcomes if out.ledger_error is not None]
    for out in lost[:3]:
        print(f"         index {out.index} ledger not written: {out.ledger_error}")
    if alone is not None and ok:
        alone_total = alone.start_requests + alone.ledger_requests
        mean_total = statistics.mean(out.start_requests + out.ledger_requests for out in ok)
        print(
            f"         requests per index {mean_total:.1f} = {mean_total / alone_total:.2f}x "
            f"one sidecar alone "
            f"({alone_total}); every index locked in {all_ready:.2f} s = "
            f"{all_ready / ((alone.ready or 0) - alone.released):.1f}x one alone"
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--indexes", type=int, nargs="+", default=[64, 256, 1024], help="sidecars per run")
    parser.add_argument(
        "--procs", type=int, default=8, help="processes the sidecars' threads run in (default 8)"
    )
    parser.add_argument("--smoke", action="store_true", help="4 and 8 indexes in 2 processes")
    args = parser.parse_args()
    if args.smoke:
        parser.set_defaults(indexes=[4, 8], procs=2)
        args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-scale-") as tmp, run_seaweedfs(Path(tmp)) as server:
        print(f"SeaweedFS {server.endpoint}; sidecars: threads over {args.procs} processes, own clients each")
        print(
            f"{'':>8} {'N':>6} {'locked s':>9} {'refused':>8} {'records':>8} {'req/idx':>8} {'max':>6} "
            f"{'ledger s':>9} {'req/idx':>8} {'max':>6} {'leases':>6}   answers by status"
        )
        (alone,) = run_once(server, 1, 1)
        report("alone", [alone], None)
        for count in args.indexes:
            report("N", run_once(server, count, args.procs), alone)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
