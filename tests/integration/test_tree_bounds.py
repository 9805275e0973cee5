"""What the trainer's tree costs the sidecar, as real processes: the command cache bounded in
bytes whatever the argv, a wide tree's samples listing a bounded number of processes with exact
totals, and ``soak-sidecar report`` over them."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from sidecar.adapters.procfs import _Commands, _known_classes
from sidecar.core.redaction import DEFAULT_RULES
from sidecar.core.samples import COMMAND_MAX_CHARS, FD_CLASSES

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]


def test_the_command_cache_is_bounded_in_bytes_whatever_the_argv() -> None:
    limit = 1024 * 1024
    commands = _Commands(COMMAND_MAX_CHARS, DEFAULT_RULES, max_bytes=limit)
    cmdlines = [b"python\0train.py\0" + f"{n:08x}".encode() * 2048 + b"\0" for n in range(10_000)]
    for _ in range(2):
        commands.new_sample()
        texts = [commands(cmdline) for cmdline in cmdlines]
        assert commands.cached_bytes <= limit
    assert all(len(text) <= COMMAND_MAX_CHARS for text in texts)
    assert texts[0].startswith("python train.py 00000000")
    assert texts[-1].startswith("python train.py 0000270f")  # past the bound: redacted afresh, same text


def test_a_launchers_report_names_only_known_fd_classes() -> None:
    claimed = {"pipe": 3, "x" * 100_000: 5, "other": 1, "socket": 2}
    assert _known_classes(claimed) == {"pipe": 3, "other": 6, "socket": 2}
    assert set(_known_classes({f"c{n}": 1 for n in range(32)})) <= set(FD_CLASSES)


TRAINER = textwrap.dedent(
    """
    import os, subprocess, sys, time
    from pathlib import Path
    from sidecar.examples.replay_summary import run_summary, write_atomic
    progress = Path(os.environ["SOAK_PROGRESS_DIR"])
    children = [
        subprocess.Popen(["sh", "-c", "read x", f"worker-{n}", "z" * 600], stdin=subprocess.PIPE)
        for n in range(40)
    ]
    (progress / "children").write_text("up")
    for step in range(8):
        (progress / "step").write_text(str(step))
        time.sleep(0.2)
    for child in children:
        child.stdin.close()
        child.wait()
    write_atomic(progress / "run_summary.json",
                 run_summary(steps=8, completed=True, classification="normal_completion", error=None))
    """
)


def test_a_wide_trees_samples_list_a_bounded_number_of_processes_and_the_report_draws_them(
    tmp_path: Path,
) -> None:
    out = tmp_path / "out"
    env = {k: v for k, v in os.environ.items() if not k.startswith("SOAK_")}
    env.update(
        SOAK_MONITOR__SAMPLE_PROCESSES="4",
        SOAK_MONITOR__STATUS_LINE="off",
        PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")])),
    )
    argv = [sys.executable, "-m", "sidecar.cli", "run", "--local", "--output", str(out)]
    argv += ["--sample-interval", "0.2", "--post-shutdown-grace", "0.2", "--gpu-backend", "none"]
    argv += ["--", sys.executable, "-c", TRAINER]
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=180, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    (samples,) = out.glob("runs/*/attempt-1/samples.jsonl.gz")
    lines = [json.loads(line) for line in gzip.decompress(samples.read_bytes()).splitlines()]
    wide = [line["process"] for line in lines if line["process"]["process_count"] > 40]
    assert wide, "no sample saw the whole tree"
    recorded: dict[str, str] = {}
    for line in lines:
        tree = line["process"]
        assert len(tree["processes"]) <= 4
        for ident in tree.get("commands", {}):
            assert ident not in recorded
        recorded.update(tree.get("commands", {}))
        unlisted = tree.get("unlisted", {"count": 0, "rss_kib": 0})
        assert unlisted["count"] + len(tree["processes"]) == tree["process_count"]
        assert unlisted["rss_kib"] + sum(p["rss_kib"] for p in tree["processes"]) == tree["rss_kib_total"]
        assert all(p["command_id"] in recorded and "command" not in p for p in tree["processes"])
    # The launcher and the trainer are listed in every sample that has them.
    first = lines[0]["process"]["processes"]
    (launcher,) = {p["pid"] for p in first if p["ppid"] not in {q["pid"] for q in first}}
    assert all(launcher in {p["pid"] for p in tree["processes"]} for tree in wide)
    (attempt,) = out.glob("runs/*/attempt-1")
    report = subprocess.run(
        [sys.executable, "-m", "sidecar.cli", "report", str(attempt)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert report.returncode == 0, report.stderr[-3000:]
    assert (attempt / "report.html").stat().st_size > 0
