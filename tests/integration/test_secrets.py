"""Secrets stay out of what the product stores and prints: the real CLI, launcher and trainer.

The trainer's argv carries a password, an API key and a Hugging Face token; none of them may show
up in the artifact, the samples, the deadline record (and the trainer's copy of it) or the
sidecar's output. A locally started trainer gets none of the sidecar's settings and credentials,
in any case.
"""

from __future__ import annotations

import gzip
import json
import os
import shutil
import sys
import textwrap
from pathlib import Path

import pytest

from tests.fixtures.processes import Spawner
from tests.integration.test_cli_local import DATA, FAST, cli
from tests.integration.test_supervisor_rules import status_samples
from tests.waiting import wait_until

pytestmark = pytest.mark.integration

SECRETS = ("hunter2", "sk-live0123456789abcdefghij", "hf_abcdefghijklmnopqrstuvwx", "AKIAEXAMPLEKEY123456")

RELEASE = "release"  # written to the progress dir once the sidecar has sampled the trainer

# Records its environment and argv, steps (8 times at least) until the sidecar has sampled it, then
# passes.
TRAINER = textwrap.dedent(
    f"""
    import json, os, pathlib, shutil, sys, time
    progress = pathlib.Path(os.environ["SOAK_PROGRESS_DIR"])
    (progress / "seen.json").write_text(json.dumps({{"env": dict(os.environ), "argv": sys.argv}}))
    for step in range(6000):
        (progress / "step").write_text(str(step) * (step + 1))
        if step >= 7 and (progress / "{RELEASE}").exists():
            break
        time.sleep(0.1)
    shutil.copy(sys.argv[1], progress / "run_summary.json")
    """
)


def test_secrets_in_the_trainers_argv_are_stored_nowhere(tmp_path: Path, spawn: Spawner) -> None:
    # A script file, not -c: the sampled command is cut at 512 characters, the secrets must be in.
    script_file = tmp_path / "trainer.py"
    script_file.write_text(TRAINER, encoding="utf-8")
    trainer = [
        sys.executable, str(script_file), str(DATA / "minimal_completed.json"),
        f"--password={SECRETS[0]}", "--api-key", SECRETS[1], "--model", SECRETS[2],
    ]  # fmt: skip
    env = {
        "AWS_ACCESS_KEY_ID": SECRETS[3],
        "AWS_SECRET_ACCESS_KEY": "s3cr3t-value",
        "SOAK_REDACTION__EXTRA_WORDS": "[]",
        # In any case: the sidecar reads its settings whatever the case (this one is its S3
        # endpoint, unused without a bucket), and a credential is one in any case.
        "aws_secret_access_key": "s3cr3t-value",
        "soak_s3__endpoint_url": "http://127.0.0.1:9",
        "kubeconfig": str(tmp_path / "kubeconfig"),
    }
    # As cli() runs it, but started here: the trainer runs until the sidecar's status output
    # (--status json, one object per sample) shows it sampled the trainer, the tree's second process.
    script = shutil.which("soak-sidecar")
    argv = [script] if script else [sys.executable, "-m", "sidecar.cli"]
    clean = {k: v for k, v in os.environ.items() if not k.startswith("SOAK_")}
    stdout, stderr = tmp_path / "sidecar.stdout", tmp_path / "sidecar.stderr"
    with stdout.open("wb") as out_file, stderr.open("wb") as err_file:
        proc = spawn(
            [*argv, "run", "--local", *FAST, "--status", "json", "--", *trainer],
            cwd=tmp_path,
            env={**clean, **env},
            stdout=out_file,
            stderr=err_file,
        )
    out = tmp_path / "soak-output"
    wait_until("a sample of the trainer", lambda: any(s["processes"] >= 2 for s in status_samples(stderr)))
    (progress_dir,) = out.glob("runs/*/progress")
    (progress_dir / RELEASE).touch()
    returncode = proc.wait(timeout=120)
    output = stdout.read_text(encoding="utf-8") + stderr.read_text(encoding="utf-8")
    assert returncode == 0, output
    (seen_file,) = out.glob("runs/*/progress/seen.json")
    seen = json.loads(seen_file.read_text(encoding="utf-8"))
    assert SECRETS[0] in " ".join(seen["argv"])  # the trainer itself got its real arguments
    leaked = env.keys() & seen["env"].keys()
    assert not leaked

    (artifact_file,) = out.glob("runs/*/attempt-1/artifact.json")
    (samples_file,) = out.glob("runs/*/attempt-1/samples.jsonl.gz")
    (record_file,) = out.glob("deadlines/*.json")
    (trainer_copy,) = out.glob("runs/*/run/deadline.json")
    stored = {
        "artifact.json": artifact_file.read_text(encoding="utf-8"),
        "samples.jsonl.gz": gzip.decompress(samples_file.read_bytes()).decode(),
        "deadline record": record_file.read_text(encoding="utf-8"),
        "run/deadline.json": trainer_copy.read_text(encoding="utf-8"),
        "sidecar output": output,
    }
    for name, text in stored.items():
        for secret in (*SECRETS[:3], "s3cr3t-value"):
            assert secret not in text, f"{secret} in {name}"
    artifact = json.loads(stored["artifact.json"])
    assert artifact["command"][-5:] == [
        "--password=<redacted>",
        "--api-key",
        "<redacted>",
        "--model",
        "<redacted>",
    ]
    assert "--api-key <redacted>" in stored["samples.jsonl.gz"]  # the sampled process, redacted
    identity = json.loads(stored["deadline record"])["identity"]
    assert len(identity["command_sha256"]) == 64  # the unredacted command still identifies the run


# Leaves a worker behind whose argv carries its own secret, so the launcher must kill it after the
# trainer ends and names it in exit.json: the command lines the launcher records, unredacted.
LEAVES_A_WORKER = textwrap.dedent(
    """
    import os, subprocess, sys
    sleeper = [sys.executable, "-c", "import time; time.sleep(600)"]
    worker = subprocess.Popen([*sleeper, "--password", sys.argv[4]])
    with open(os.path.join(os.environ["SOAK_PROGRESS_DIR"], "worker.pid"), "w") as out:
        out.write(str(worker.pid))
    """
)


def test_a_local_run_leaves_no_unredacted_command_line_on_disk(tmp_path: Path) -> None:
    script_file = tmp_path / "trainer.py"
    script_file.write_text(LEAVES_A_WORKER, encoding="utf-8")
    secrets = ("hunter2SECRET", "two words hunter3")
    done = cli(
        "run", "--local", *FAST, "--", sys.executable, str(script_file), "--api-key", secrets[0],
        "--token", secrets[1],
        cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode != 0, done.stderr  # no run_summary.json, a worker left behind
    out = tmp_path / "soak-output"
    (pid_file,) = out.glob("runs/*/progress/worker.pid")
    artifact = json.loads(next(out.glob("runs/*/attempt-1/artifact.json")).read_text(encoding="utf-8"))
    killed = artifact["post_shutdown"]["launcher_exit"]["survivors_killed"]
    assert [p["pid"] for p in killed] == [int(pid_file.read_text())]
    assert killed[0]["command"][-2:] == ["--password", "<redacted>"]  # one argument, quoting kept
    stored = [path for path in out.rglob("*") if path.is_file() and "progress" not in path.parts]
    assert any(path.name == "launcher.json" for path in stored)  # kept, redacted
    for path in stored:
        data = path.read_bytes()
        text = gzip.decompress(data).decode() if path.suffix == ".gz" else data.decode(errors="replace")
        for secret in (*secrets, "hunter3"):
            assert secret not in text, f"{secret} in {path.relative_to(out)}"
