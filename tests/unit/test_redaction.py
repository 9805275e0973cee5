"""Secrets in trainer command lines: what is redacted, what is kept, and the configured extras."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sidecar.core.redaction import (
    DEFAULT_RULES,
    LOOKAHEAD_CHARS,
    MAX_ARGUMENT_CHARS,
    REDACTED,
    RedactionRules,
    redact_command,
    redact_exit_record,
    redacted_line,
)
from sidecar.core.trainer_env import trainer_environment, withheld
from sidecar.launcher.protocol.exit import ExitRecord, KilledProcess
from sidecar.settings.model import Settings, load_settings

R = REDACTED


@pytest.mark.parametrize(
    ("command", "expected"),
    [
        (["train.py", "--password=hunter2"], ["train.py", f"--password={R}"]),
        (["train.py", "--api-key", "k-123", "--lr", "0.1"], ["train.py", "--api-key", R, "--lr", "0.1"]),
        (["train.py", "--hf-token", "abc"], ["train.py", "--hf-token", R]),
        (
            ["train.py", "--secret", "s", "--credentials=a:b"],
            ["train.py", "--secret", R, f"--credentials={R}"],
        ),
        (["train.py", "--dbPassword", "p"], ["train.py", "--dbPassword", R]),
        (
            ["env", "AWS_SECRET_ACCESS_KEY=x", "HF_TOKEN=y", "python"],
            ["env", f"AWS_SECRET_ACCESS_KEY={R}", f"HF_TOKEN={R}", "python"],
        ),
        (["curl", "-H", "Authorization: Bearer abc"], ["curl", "-H", f"Authorization: {R}"]),
        (["x", "https://user:pa55@host/path"], ["x", f"https://user:{R}@host/path"]),
        (["x", "--model", "hf_abcdefghijklmnopqrstuv"], ["x", "--model", R]),
        (["x", "--openai", "sk-abcdefghijklmnopqrstuv"], ["x", "--openai", R]),
        (["x", "ghp_abcdefghijklmnopqrstuvwxyz0123"], ["x", R]),
        (["x", "AKIAABCDEFGHIJKLMNOP"], ["x", R]),
        (["python", "-c", "login('hf_abcdefghijklmnopqrstuv')"], ["python", "-c", f"login('{R}')"]),
    ],
)
def test_secrets_are_redacted(command: list[str], expected: list[str]) -> None:
    assert redact_command(command) == tuple(expected)


@pytest.mark.parametrize(
    "command",
    [
        ["torchrun", "--nproc-per-node", "8", "train.py", "--max-tokens", "4096"],
        ["train.py", "--key-file", "/etc/key.pem", "--token-path", "/var/run/token"],
        ["train.py", "--monkey", "see", "--tokenizer", "bpe", "https://host/path"],
        ["train.py", "--secret", "--verbose"],  # a flag that takes no value keeps the next flag
    ],
)
def test_ordinary_arguments_are_kept(command: list[str]) -> None:
    assert redact_command(command) == tuple(command)


def test_configured_words_and_patterns_are_redacted_too() -> None:
    rules = RedactionRules(extra_words=frozenset({"salt"}), extra_patterns=(r"corp-[0-9]{6}",))
    assert redact_command(["x", "--salt", "s", "id=corp-123456"], rules) == ("x", "--salt", R, f"id={R}")
    assert redact_command(["x", "--salt", "s"], DEFAULT_RULES) == ("x", "--salt", "s")


def test_the_trainer_gets_no_sidecar_settings_or_credentials() -> None:
    environ = {
        "PATH": "/bin",
        "HOME": "/root",
        "AWS_ACCESS_KEY_ID": "a",
        "AWS_SECRET_ACCESS_KEY": "s",
        "AWS_PROFILE": "p",
        "SOAK_S3__BUCKET": "b",
        "KUBECONFIG": "/k",
        "CUDA_VISIBLE_DEVICES": "0",
    }
    assert trainer_environment(environ) == {"PATH": "/bin", "HOME": "/root", "CUDA_VISIBLE_DEVICES": "0"}
    kept = trainer_environment(environ, keep=["AWS_PROFILE"])
    assert kept["AWS_PROFILE"] == "p" and "AWS_SECRET_ACCESS_KEY" not in kept


def test_the_trainer_gets_them_in_no_case_either() -> None:
    environ = {
        "PATH": "/bin",
        "aws_secret_access_key": "s",
        "Aws_Access_Key_Id": "a",
        "aws_profile": "p",
        "soak_s3__endpoint_url": "http://evil",
        "kubeconfig": "/k",
        "Boto_Config": "/b",
        "SOA\u212a_S3__BUCKET": "b",  # KELVIN SIGN: lowers to "k"
    }
    assert trainer_environment(environ) == {"PATH": "/bin"}
    # keep names a variable exactly: AWS_PROFILE keeps no aws_profile.
    assert trainer_environment(environ, keep=["AWS_PROFILE", "aws_profile"]) == {
        "PATH": "/bin",
        "aws_profile": "p",
    }
    assert trainer_environment(environ, keep=["AWS_PROFILE"]) == {"PATH": "/bin"}


def test_every_setting_is_withheld_in_every_spelling_the_settings_read(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for group, group_field in Settings.model_fields.items():
        assert group_field.annotation is not None
        for name in group_field.annotation.model_fields:
            env = f"SOAK_{group}__{name}"
            assert all(map(withheld, (env.upper(), env.lower(), env.title()))), env
    # The reason for folding: the settings are read whatever the case.
    monkeypatch.setenv("soak_metrics__linger_s", "5")
    monkeypatch.setenv("SOA\u212a_METRICS__PORT", "9")
    assert (load_settings().metrics.linger_s, load_settings().metrics.port) == (5.0, 9)
    assert withheld("SOA\u212a_METRICS__PORT")


@pytest.mark.parametrize(
    ("command", "expected"),
    [
        (
            ["sh", "-c", "python train.py --password X --lr 1"],
            ["sh", "-c", f"python train.py --password {R} --lr 1"],
        ),
        (["x", "--token X"], ["x", f"--token {R}"]),
        (["mysql", "--password", "-X"], ["mysql", "--password", R]),
        (["mysql", "-p", "X"], ["mysql", "-p", R]),
        (["x", "https://h/p?token=abc&x=1"], ["x", f"https://h/p?token={R}&x=1"]),
        (["x", "https://h/p?a=1&access_token=abc"], ["x", f"https://h/p?a=1&access_token={R}"]),
        (["curl", "-H", "X-Api-Key: X"], ["curl", "-H", f"X-Api-Key: {R}"]),
        (["curl", "-H", "Cookie: session=X"], ["curl", "-H", f"Cookie: {R}"]),
        (["docker", "run", "--env=HF_TOKEN=X"], ["docker", "run", f"--env=HF_TOKEN={R}"]),
        (["java", "-Dpassword=X", "-Ddb.password=Y"], ["java", f"-Dpassword={R}", f"-Ddb.password={R}"]),
        # Found by the adversary review of this fixes.
        (["mysql", "-pX", "-p=Y"], ["mysql", f"-p{R}", f"-p={R}"]),
        (
            ["x", "--db-pass", "X", "DB_PASS=Y", "--bypass", "on"],
            ["x", "--db-pass", R, f"DB_PASS={R}", "--bypass", "on"],
        ),
        (["x", "--passwd=", "X"], ["x", f"--passwd={R}", R]),
        (
            ["sh", "-c", "curl -H 'X-Api-Key: X' https://h"],
            ["sh", "-c", f"curl -H 'X-Api-Key: {R}' https://h"],
        ),
    ],
)
def test_the_forms_a_reviewer_found_missed_are_redacted(command: list[str], expected: list[str]) -> None:
    assert redact_command(command) == tuple(expected)


def test_the_processes_the_launcher_killed_are_redacted_argument_by_argument() -> None:
    # exit.json keeps each killed process's argv: a value with spaces stays one argument.
    record = ExitRecord(
        launch_id=None,
        exit_code=0,
        reason="exited",
        killed_with_trainer=(KilledProcess(7, ("python", "w.py", "--password", "two words", "--lr", "1")),),
        survivors_killed=(KilledProcess(8, ("curl", "-H", "Authorization: Bearer abc def", "https://h")),),
    )
    redacted = redact_exit_record(record)
    assert redacted.killed_with_trainer[0].command == ("python", "w.py", "--password", R, "--lr", "1")
    assert redacted.survivors_killed[0].command == ("curl", "-H", f"Authorization: {R}", "https://h")


def test_a_huge_argument_is_cut_before_matching_and_storing() -> None:
    hostile = "a" + "0123456789abcdef" * 65_536  # 1 MiB of hex: a scheme-like run with no "://"
    (kept,) = redact_command([hostile])
    assert len(kept) < MAX_ARGUMENT_CHARS + 64 and kept.endswith(
        f"...[{len(hostile) - MAX_ARGUMENT_CHARS}-more-chars]"
    )
    (secret,) = redact_command(["--password=" + "x" * 2 * MAX_ARGUMENT_CHARS])
    assert secret == f"--password={R}"


def test_a_sampled_line_stores_no_readable_prefix_of_a_secret_at_the_cut() -> None:
    token = "hf_" + "a1" * 30
    for filler in range(480, 520):  # the token starts just before, at and after the cut
        line = redacted_line(["x" * filler, token, "--password", "hunter2"], 512)
        assert "a1a1" not in line and "hunter2" not in line
        assert len(line) <= 512


def test_a_sampled_line_matches_nothing_past_the_cut() -> None:
    read: list[int] = []

    def arguments() -> Iterator[str]:  # 100 MB of hostile arguments, as a trainer may pass
        for index in range(1000):
            read.append(index)
            yield "0123456789abcdef" * 6_250

    assert len(redacted_line(arguments(), 512)) == 512
    assert len(read) == 1  # the first argument already reaches the cut
    assert redacted_line(["python", "-m", "train", "--api-key", "k"], 512) == f"python -m train --api-key {R}"


@given(st.lists(st.text(max_size=LOOKAHEAD_CHARS), max_size=12), st.integers(min_value=1, max_value=600))
def test_a_sampled_line_is_a_prefix_of_the_whole_redacted_command(command: list[str], max_chars: int) -> None:
    # Arguments no longer than the lookahead are matched whole: the same redaction as the stored command.
    line = redacted_line(command, max_chars)
    assert len(line) <= max_chars
    assert " ".join(redact_command(command)).startswith(line)


def test_a_secret_word_glued_to_the_end_of_a_name_is_a_secret() -> None:
    command = ("env", "PGPASSWORD=x1", "MYSECRET=x2", "--dbtoken", "x3", "--monkey=x4", "--bypass", "x5")
    assert redact_command(command) == (
        "env", f"PGPASSWORD={R}", f"MYSECRET={R}", "--dbtoken", R, "--monkey=x4", "--bypass", "x5",
    )  # fmt: skip
