"""The skills scanner: prompt-injection and exfiltration patterns in skill text.

A skill is text the model will follow, so text that tries to override its instructions,
hide from the person, or send secrets or files elsewhere is flagged before it can reach a
prompt. The patterns are deliberately plain: a false positive quarantines a skill the
operator can read and re-install; a miss lets a stranger steer the agent.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_I = re.IGNORECASE
_PATTERNS: tuple[tuple[str, re.Pattern[str]], ...] = (
    (
        "asks to ignore earlier instructions",
        re.compile(
            r"\b(ignore|disregard|forget|override)\b[^.\n]{0,40}\b(previous|prior|above|earlier|"
            r"all|system|your|the)\b[^.\n]{0,30}\b(instructions?|prompts?|rules|guidelines)\b",
            _I,
        ),
    ),
    (
        "claims a new identity or system role",
        re.compile(
            r"\b(you are now|from now on,? you are|new system prompt|act as the system)\b"
            r"|<\s*/?\s*system\s*>|\[\s*system\s*\]",
            _I,
        ),
    ),
    (
        "tells the agent to hide from the person",
        re.compile(
            r"\b(do not|don't|never)\s+(tell|inform|mention|reveal|show)[^.\n]{0,30}"
            r"\b(the )?(user|person|owner|operator|human)\b",
            _I,
        ),
    ),
    (
        "reveals the system prompt",
        re.compile(
            r"\b(reveal|print|output|repeat|send)\b[^.\n]{0,30}\b(system prompt|your instructions)",
            _I,
        ),
    ),
    (
        "sends secrets or environment variables out",
        re.compile(
            r"\b(curl|wget|fetch|post|send|upload|exfiltrat\w*)\b[^\n]{0,80}"
            r"(\$\{?[A-Z_]*(KEY|TOKEN|SECRET|PASSWORD|PASSWD)[A-Z_]*\}?|\benv\b|printenv|"
            r"\.env\b|api[_ ]?keys?|credentials|private keys?|ssh keys?)",
            _I,
        ),
    ),
    (
        "reads credential files",
        re.compile(
            r"(~|\$HOME)/\.(ssh|aws|gnupg|netrc|config/gh)\b|/etc/(passwd|shadow)\b"
            r"|\bid_(rsa|ed25519)\b",
            _I,
        ),
    ),
    (
        "pipes environment or files into the network",
        re.compile(r"\b(env|printenv|cat [^|\n]+)\s*\|\s*(curl|wget|nc|netcat)\b", _I),
    ),
    (
        "hides text with invisible or direction-changing characters",
        re.compile("[\u200b\u200c\u200d\u2060\u2062\u2063\u2064\u202a-\u202e\u2066-\u2069\ufeff]"),
    ),
)


@dataclass(frozen=True, slots=True)
class Finding:
    """One flagged passage."""

    reason: str
    excerpt: str
    where: str = "SKILL.md"

    def __str__(self) -> str:
        return f"{self.where}: {self.reason} ({self.excerpt!r})"


def scan_text(text: str, where: str = "SKILL.md") -> list[Finding]:
    """The flagged passages of `text` (empty when it looks safe)."""
    found: list[Finding] = []
    body = text.lstrip("\ufeff")  # a byte-order mark at the start is harmless
    for reason, pattern in _PATTERNS:
        match = pattern.search(body)
        if match is not None:
            excerpt = " ".join(match.group(0).split())[:80] or repr(match.group(0))
            found.append(Finding(reason, excerpt, where))
    return found
