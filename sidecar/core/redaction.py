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

import re
from collections.abc import Sequence
from dataclasses import dataclass, field

REDACTED = "<redacted>"

# Words that make a flag or variable name secret when the name ends in one (``--api-key``,
# ``HF_TOKEN``, ``dbPassword``; not ``--key-file`` or ``--token-path``, which name files),
# case-insensitively.
SECRET_WORDS = frozenset(
    {
        "apikey",
        "auth",
        "authorization",
        "credential",
        "credentials",
        "key",
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
_NAME = re.compile(r"^(?P<dashes>-{1,2})?(?P<name>[A-Za-z][A-Za-z0-9_.\-]*)=(?P<value>.*)$", re.DOTALL)
_FLAG = re.compile(r"^-{1,2}(?P<name>[A-Za-z][A-Za-z0-9_.\-]*)$")
_HEADER = re.compile(r"(?i)\b(?P<head>(?:proxy-)?authorization\s*[:=]\s*)(?P<value>\S.*)$", re.DOTALL)
_URL_PASSWORD = re.compile(r"(?P<head>[A-Za-z][A-Za-z0-9+.\-]*://[^/\s:@]+:)(?P<password>[^/\s@]+)(?P<at>@)")
_WORD_SPLIT = re.compile(r"[^A-Za-z0-9]+|(?<=[a-z])(?=[A-Z])")


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
        words = [word.lower() for word in _WORD_SPLIT.split(name) if word]
        secret = SECRET_WORDS | {word.lower() for word in self.extra_words}
        return bool(words) and words[-1] in secret

    def tokens(self, text: str) -> str:
        return self._tokens.sub(REDACTED, text)


DEFAULT_RULES = RedactionRules()


def redact_command(command: Sequence[str], rules: RedactionRules = DEFAULT_RULES) -> tuple[str, ...]:
    """``command`` with every secret value replaced by ``<redacted>``; same length, same flags."""
    redacted: list[str] = []
    secret_next = False
    for argument in command:
        if secret_next and not argument.startswith("-"):
            redacted.append(REDACTED)
            secret_next = False
            continue
        flag = _FLAG.match(argument)
        secret_next = flag is not None and rules.secret_name(flag.group("name"))
        redacted.append(redact_argument(argument, rules))
    return tuple(redacted)


def redact_argument(argument: str, rules: RedactionRules = DEFAULT_RULES) -> str:
    """One argument: a secret ``name=value``, an Authorization header, a URL password, a token."""
    named = _NAME.match(argument)
    if named is not None and rules.secret_name(named.group("name")):
        return f"{named.group('dashes') or ''}{named.group('name')}={REDACTED}"
    argument = _HEADER.sub(lambda m: m.group("head") + REDACTED, argument)
    argument = _URL_PASSWORD.sub(lambda m: m.group("head") + REDACTED + m.group("at"), argument)
    return rules.tokens(argument)


def redact_command_line(text: str, rules: RedactionRules = DEFAULT_RULES) -> str:
    """A command line already joined with spaces (the launcher's exit record), word by word; an
    Authorization header's value is redacted to the end of the line."""
    text = _HEADER.sub(lambda m: m.group("head") + REDACTED, text)
    return " ".join(redact_command(text.split(" "), rules))
