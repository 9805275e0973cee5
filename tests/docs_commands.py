"""The commands the docs show, as written: every ``helm``, ``kubectl`` and ``soak-sidecar`` line of
the shell blocks in README.md, docs/helm.md and docs/trainers.md (continuation lines joined), and
docs/workflows.md's session (WORKFLOWS: its commands run in order in one directory).

Placeholders that stand for the user's own things (their trainer image and command, their bucket,
their GPUs) are swapped by the one table below; nothing else is changed. A trailing ``# ... exit N``
comment is the exit code the docs promise (0 when none is given). A command sent to the background
(``... &``) is one script with the lines after it, up to the line that ``wait``s for it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
DOCS = (REPO_ROOT / "README.md", REPO_ROOT / "docs" / "helm.md", REPO_ROOT / "docs" / "trainers.md")
WORKFLOWS = REPO_ROOT / "docs" / "workflows.md"
TOOLS = ("helm", "kubectl", "soak-sidecar")
CHART_IMAGE = "soak-sidecar:0.1.0"  # the chart's default image (appVersion); the e2e image is tagged so
EXAMPLE_TRAINER_JSON = '["python3","-m","sidecar.examples.trainer"]'

# placeholder as the docs write it -> what the test cluster has; {s3} is the bucket's endpoint URL,
# {access_key} and {secret_key} its credentials.
PLACEHOLDERS = {
    "my/trainer:1.2": CHART_IMAGE,
    "registry.example.com/ml/trainer:2024.06": CHART_IMAGE,
    "registry.example.com/soak-sidecar": "soak-sidecar",
    '["python3","train.py"]': EXAMPLE_TRAINER_JSON,
    '["torchrun","--nproc-per-node=1","train.py"]': EXAMPLE_TRAINER_JSON,
    # No GPUs on the test node: the GPU request would leave the pod Pending.
    '{"limits":{"nvidia.com/gpu":1}}': "{}",
    "s3.bucket=soaks": "s3.bucket=soak-e2e --set s3.endpointUrl={s3}",
    "s3.bucket=my-soak-bucket": "s3.bucket=soak-e2e --set s3.endpointUrl={s3}",
    "python3 train.py --epochs 3": "python3 -m sidecar.examples.trainer --steps 3",
    "AWS_ACCESS_KEY_ID=my-access-key": "AWS_ACCESS_KEY_ID={access_key}",
    "AWS_SECRET_ACCESS_KEY=my-secret-key": "AWS_SECRET_ACCESS_KEY={secret_key}",
}
_EXIT = re.compile(r"\bexit (\d+)\b")


@dataclass(frozen=True)
class DocCommand:
    source: str  # file:line
    text: str  # as written (continuations joined)
    expected_exit: int

    @property
    def tool(self) -> str:
        return self.text.split()[0]

    def substituted(self, **values: str) -> str:
        text = self.text
        for placeholder, replacement in PLACEHOLDERS.items():
            filled = replacement
            for name, value in values.items():
                filled = filled.replace("{" + name + "}", value)
            text = text.replace(placeholder, filled)
        return text


def _split_comment(line: str) -> tuple[str, str]:
    """Command and trailing comment: a ``#`` preceded by whitespace, outside quotes."""
    quote = ""
    for i, char in enumerate(line):
        if quote:
            quote = "" if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i].rstrip(), line[i + 1 :].strip()
    return line.rstrip(), ""


def doc_commands() -> list[DocCommand]:
    return [command for doc in DOCS for command in commands_of(doc, TOOLS)]


def commands_of(doc: Path, tools: tuple[str, ...]) -> list[DocCommand]:
    """The commands of ``doc``'s shell blocks whose first word is one of ``tools``, in order."""
    found = []
    in_shell, in_script, pending, start = False, False, "", 0
    comments: list[str] = []
    for number, line in enumerate(doc.read_text(encoding="utf-8").splitlines(), start=1):
        if line.startswith("```"):
            in_shell = not in_shell and line.strip("`").strip() in ("bash", "sh", "shell")
            continue
        if not in_shell:
            continue
        code, comment = _split_comment(line)
        if not pending:
            start, comments = number, []
        comments.append(comment)
        if code.endswith("\\"):
            pending += code[:-1].rstrip() + " "
            continue
        in_script = in_script or (code.endswith("&") and not code.endswith("&&"))
        if in_script and "wait" not in code.split():
            pending += code + "\n"
            continue
        in_script = False
        text = (pending + code).strip()
        pending = ""
        if text.split(maxsplit=1)[:1] and text.split()[0] in tools:
            match = _EXIT.search(" ".join(comments))
            found.append(DocCommand(f"{doc.name}:{start}", text, int(match.group(1)) if match else 0))
    return found


def python_snippets(doc: Path) -> dict[str, str]:
    """The ``python`` blocks of ``doc``, each under the heading above it."""
    found: dict[str, str] = {}
    heading, inside = "", False
    block: list[str] = []
    for line in doc.read_text(encoding="utf-8").splitlines():
        if line.startswith("```"):
            if inside:
                found[heading] = "\n".join(block)
            inside, block = (not inside and line.strip("`").strip() == "python"), []
            continue
        if inside:
            block.append(line)
        elif line.startswith("#"):
            heading = line.lstrip("#").strip()
    return found
