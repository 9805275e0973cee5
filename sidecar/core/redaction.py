"""Secrets in a trainer's command line, redacted wherever the product stores or prints it.

Pure. A command is redacted argument by argument:

- the value of a flag or ``NAME=value`` whose name has a secret word in it (``--api-key=...``,
  ``--password VALUE``, ``HF_TOKEN=...``, ``-H "Authorization: Bearer ..."``);
- the password of a URL (``https://user:pass@host`` keeps the user);
- anything that looks like a known token (``hf_...``, ``sk-...``, ``ghp_...``, ``AKIA...``, ...);
- whatever the configured extra patterns match.

The run identity keeps a hash of the unredacted command, so a changed secret is still a changed run.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from sidecar.launcher.protocol.exit import ExitRecord, KilledProcess
from sidecar.launcher.protocol.stacks import StacksRecord, without_command_line

REDACTED = "<redacted>"

# Words that make a flag or variable name secret when the name ends in one (``--api-key``,
# ``HF_TOKEN``, ``dbPassword``; not ``--key-file`` or ``--token-path``, which name files),
# case-insensitively.
SECRET_WORDS = frozenset(
    {
        "apikey",
        "auth",
        "cookie",
        "authorization",
        "credential",
        "credentials",
        "key",
        "pass",
        "passphrase",
        "passwd",
        "password",
        "pwd",
        "secret",
        "token",
    }
)
# Known token shapes: Hugging Face, OpenAI/Anthropic-style, GitHub, GitLab, Slack, AWS access key
# ids, Google API keys, JWTs.
TOKEN_PATTERNS = (
    r"\bhf_[A-Za-z0-9]{16,}",
    r"\bsk-[A-Za-z0-9_\-]{16,}",
    r"\b(?:ghp|gho|ghu|ghs|ghr)_[A-Za-z0-9]{20,}",
    r"\bgithub_pat_[A-Za-z0-9_]{20,}",
    r"\bglpat-[A-Za-z0-9_\-]{16,}",
    r"\bxox[abprs]-[A-Za-z0-9\-]{10,}",
    r"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b",
    r"\bAIza[0-9A-Za-z_\-]{30,}",
    r"\beyJ[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]{8,}",
)
# Every pattern here is anchored or bounded, so matching an argument costs time linear in its
# length, and an argument is cut to MAX_ARGUMENT_CHARS before it is matched or stored: nothing a
# trainer passes on a command line can stall the sampling that redacts it. The operator's extra
# patterns (settings) are only checked to compile: their cost is the operator's to keep linear.
MAX_ARGUMENT_CHARS = 4096
_NAME = re.compile(r"^(?P<dashes>-{1,2})?(?P<name>[A-Za-z][A-Za-z0-9_.\-]{0,127})=(?P<value>.*)$", re.DOTALL)
_FLAG = re.compile(r"^-{1,2}(?P<name>[A-Za-z][A-Za-z0-9_.\-]{0,127})$")
# A header as curl takes it (``Authorization: Bearer x``, ``X-Api-Key: x``, ``Cookie: a=b``).
_HEADER = re.compile(
    r"^(?P<head>\s*(?P<name>[A-Za-z][A-Za-z0-9\-]{0,63})\s{0,8}:\s{0,8})(?P<value>\S.*)$", re.DOTALL
)
_AUTHORIZATION = re.compile(
    r"(?i)\b(?P<head>(?:proxy-)?authorization\s{0,8}[:=]\s{0,8})(?P<value>\S.*)$", re.DOTALL
)
_URL_PASSWORD = re.compile(
    r"(?P<head>[A-Za-z][A-Za-z0-9+.\-]{0,31}://[^/\s:@]{1,256}:)(?P<password>[^/\s@]{1,1024})(?P<at>@)"
)
_QUERY = re.compile(r"(?P<head>[?&;](?P<name>[A-Za-z][A-Za-z0-9_.\-]{0,63})=)(?P<value>[^&#\s'\"]*)")
_SPACE = re.compile(r"(\s+)")
_WORD_SPLIT = re.compile(r"[^A-Za-z0-9]+|(?<=[a-z])(?=[A-Z])")
# A secret word this long counts glued to the end of a longer one too; shorter ones (key, pass, pwd,
# auth) only as words of their own, or --monkey and --bypass would be secrets.
GLUED_MIN_CHARS = 5
# Header names that carry a secret though no secret word ends them.
SECRET_HEADERS = frozenset({"cookie", "set-cookie"})
# Short flags whose value is a password (mysql -pX / -p X, sshpass -p X).
SECRET_SHORT_FLAGS = frozenset({"p"})
# A secret short flag with its value glued on (mysql's ``-pSECRET``; ``find -print`` is then redacted
# too: a command line shown with too little is better than a password shown); ``-p=x`` is NAME=value.
_GLUED_SHORT = re.compile(rf"^-(?P<flag>[{''.join(sorted(SECRET_SHORT_FLAGS))}])[^=\s]", re.DOTALL)


@dataclass(frozen=True)
class RedactionRules:
    """What counts as a secret: the built-in words and patterns plus the configured extras."""

    extra_words: frozenset[str] = frozenset()
    extra_patterns: tuple[str, ...] = ()
    _tokens: re.Pattern[str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        patterns = (*TOKEN_PATTERNS, *self.extra_patterns)
        object.__setattr__(self, "_tokens", re.compile("|".join(f"(?:{p})" for p in patterns)))

    def secret_name(self, name: str) -> bool:
        """The name's last word is a secret word, or ends in one of GLUED_MIN_CHARS or more
        (``PGPASSWORD``, ``MYSECRET``: names written as one word)."""
        words = [word.lower() for word in _WORD_SPLIT.split(name) if word]
        if not words:
            return False
        secret = SECRET_WORDS | {word.lower() for word in self.extra_words}
        last = words[-1]
        return last in secret or any(len(s) >= GLUED_MIN_CHARS and last.endswith(s) for s in secret)

    def tokens(self, text: str) -> str:
        return self._tokens.sub(REDACTED, text)


DEFAULT_RULES = RedactionRules()


def redact_command(command: Sequence[str], rules: RedactionRules = DEFAULT_RULES) -> tuple[str, ...]:
    """``command`` with every secret value replaced by ``<redacted>``; same length, same flags.
    Arguments longer than MAX_ARGUMENT_CHARS are cut (the cut is marked) before anything else."""
    return _redact_sequence([_bounded(argument) for argument in command], rules)


# How far past the stored cut an argument is still matched: a token or URL that starts before the
# cut is seen whole enough for its pattern, so no readable prefix of a secret is stored.
LOOKAHEAD_CHARS = 256


def redacted_line(command: Iterable[str], max_chars: int, rules: RedactionRules = DEFAULT_RULES) -> str:
    """``command`` redacted, joined with spaces and cut to ``max_chars``, as a sample stores it.
    Only what can reach the cut is matched (each argument to LOOKAHEAD_CHARS past it, none after
    it), so a command line of any size costs about the same: the sampler runs this on every new
    process the trainer starts."""
    kept: list[str] = []
    used = 0
    for argument in command:
        kept.append(argument[: max_chars - used + LOOKAHEAD_CHARS])
        used += len(argument) + 1
        if used > max_chars:
            break
    return " ".join(_redact_sequence(kept, rules))[:max_chars]


def _redact_sequence(command: Sequence[str], rules: RedactionRules) -> tuple[str, ...]:
    redacted: list[str] = []
    secret_next = False
    for argument in command:
        if secret_next and not argument.startswith("--"):
            redacted.append(REDACTED)  # a secret may itself start with "-"
            secret_next = False
            continue
        secret_next = _introduces_secret(argument, rules)
        redacted.append(_redact_argument(argument, rules))
    return tuple(redacted)


def redact_argument(argument: str, rules: RedactionRules = DEFAULT_RULES) -> str:
    """One argument: a secret ``name=value`` (also nested: ``--env=HF_TOKEN=x``, Java's
    ``-Dpassword=x``), a secret header, a URL password or query parameter, a token, and the words of
    an argument that is itself a command line (``sh -c '... --password x'``)."""
    return _redact_argument(_bounded(argument), rules)


def _redact_argument(argument: str, rules: RedactionRules) -> str:
    glued = _GLUED_SHORT.match(argument)
    if glued is not None:  # mysql's -pSECRET
        return f"-{glued.group('flag')}{REDACTED}"
    named = _NAME.match(argument)
    if named is not None:
        name, dashes = named.group("name"), named.group("dashes") or ""
        short = dashes == "-" and name in SECRET_SHORT_FLAGS  # -p=x
        if (
            rules.secret_name(name)
            or short
            or (dashes == "-" and name[:1] == "D" and rules.secret_name(name[1:]))
        ):
            return f"{dashes}{name}={REDACTED}"
        if not _SPACE.search(argument):
            return f"{dashes}{name}={_redact_argument(named.group('value'), rules)}"
    header = _HEADER.match(argument)
    if header is not None and _secret_header(header.group("name"), rules):
        return header.group("head") + REDACTED
    argument = _AUTHORIZATION.sub(lambda m: m.group("head") + REDACTED, argument)
    if _SPACE.search(argument):
        return _redact_words(argument, rules)
    return _redact_inline(argument, rules)


def redact_exit_record(record: ExitRecord, rules: RedactionRules = DEFAULT_RULES) -> ExitRecord:
    """exit.json with the arguments of every process the launcher killed redacted (the launcher
    records them raw: it knows no rules). The sidecar keeps no other copy of the record."""
    memory = record.memory
    if memory is not None:
        victims = tuple(
            dataclasses.replace(kill, command=redact_command(kill.command, rules))
            for kill in memory.oom_killed
        )
        memory = dataclasses.replace(memory, oom_killed=victims)
    return dataclasses.replace(
        record,
        killed_with_trainer=_redact_killed(record.killed_with_trainer, rules),
        survivors_killed=_redact_killed(record.survivors_killed, rules),
        memory=memory,
    )


def redact_stacks(record: StacksRecord, rules: RedactionRules = DEFAULT_RULES) -> StacksRecord:
    """stacks.json with each process's arguments redacted, and no raw command line in a stack (py-spy
    prints one above it; a launcher before this rule kept it)."""
    processes = tuple(
        dataclasses.replace(
            process,
            command=redact_command(process.command, rules),
            stack=None
            if process.stack is None
            else without_command_line(process.pid, process.stack, process.command),
        )
        for process in record.processes
    )
    return dataclasses.replace(record, processes=processes)


def _redact_killed(processes: Sequence[KilledProcess], rules: RedactionRules) -> tuple[KilledProcess, ...]:
    return tuple(KilledProcess(p.pid, redact_command(p.command, rules)) for p in processes)


def _bounded(argument: str) -> str:
    if len(argument) <= MAX_ARGUMENT_CHARS:
        return argument
    return f"{argument[:MAX_ARGUMENT_CHARS]}...[{len(argument) - MAX_ARGUMENT_CHARS}-more-chars]"


def _introduces_secret(argument: str, rules: RedactionRules) -> bool:
    """A flag or header name whose value is the next argument (``--password``, ``-p``, ``X-Api-Key:``,
    and ``--password=`` with the value left for the next argument)."""
    flag = _FLAG.match(argument.removesuffix("="))
    if flag is not None:
        name = flag.group("name")
        return rules.secret_name(name) or (argument == f"-{name}" and name in SECRET_SHORT_FLAGS)
    return argument.endswith(":") and _secret_header(argument[:-1], rules)


def _secret_header(name: str, rules: RedactionRules) -> bool:
    return name.lower() in SECRET_HEADERS or rules.secret_name(name)


def _redact_words(argument: str, rules: RedactionRules) -> str:
    """An argument with spaces in it, as the command line it may be: words redacted in sequence."""
    parts = _SPACE.split(argument)
    words = _redact_sequence([part.strip("'\"") for part in parts[::2]], rules)
    out: list[str] = []
    for index, part in enumerate(parts):
        if index % 2:
            out.append(part)
            continue
        word = words[index // 2]
        stripped = part.strip("'\"")
        out.append(part if word == stripped else part.replace(stripped, word, 1) if stripped else word)
    return "".join(out)


def _redact_inline(argument: str, rules: RedactionRules) -> str:
    """A URL's password and secret query parameters, then known token shapes."""
    if "://" in argument:
        argument = _URL_PASSWORD.sub(lambda m: m.group("head") + REDACTED + m.group("at"), argument)
    if "=" in argument:
        argument = _QUERY.sub(
            lambda m: m.group("head") + REDACTED if rules.secret_name(m.group("name")) else m.group(0),
            argument,
        )
    return rules.tokens(argument)
