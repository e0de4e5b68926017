"""The skills scanner: prompt-injection and exfiltration patterns in skill text.

A skill is text the model will follow, so text that tries to override its instructions,
hide from the person, or send secrets or files elsewhere is flagged before it can reach a
prompt. Text the operator cannot read as the model would is refused outright: invisible,
tag, direction-changing and control characters, and binary files past a size cap.

Before matching, text is normalised the way a reader (human or model) sees it: invisible
characters dropped, NFKC (full-width and styled letters), accents stripped, Cyrillic and
Greek look-alikes mapped to Latin. It is matched again with everything but letters and
digits removed (split words), and base64 runs are decoded and matched too.

The patterns are deliberately plain: a false positive quarantines a skill the operator can
read and re-install; a miss lets a stranger steer the agent.
"""

from __future__ import annotations

import base64
import binascii
import html
import re
import unicodedata
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from enum import StrEnum

MAX_BINARY_BYTES = 256 * 1024
"""A supporting file that is not text is allowed up to this size (past it: refused)."""

_I = re.IGNORECASE
_PATTERNS: tuple[tuple[str, re.Pattern[str]], ...] = (
    (
        "asks to ignore earlier instructions",
        re.compile(
            r"\b(ignore|disregard|forget|override|bypass|discard|abandon|set aside|"
            r"pay no attention to)\b[^.\n]{0,40}\b(previous|prior|above|earlier|preceding|"
            r"former|original|all|any|every|system|developer|your|the)\b[^.\n]{0,30}"
            r"\b(instructions?|prompts?|rules|guidelines|directives|guidance|commands|"
            r"constraints|polic(y|ies))\b"
            r"|\b(ignore|disregard|forget)\s+(everything|anything|all)\s+(above|before|"
            r"previously|earlier|you (were|have been) told)\b"
            r"|\b(stop following|no longer follow|do not follow|don't follow)\s+(your|the|any|"
            r"previous|prior|earlier|system)\b[^.\n]{0,30}\b(instructions?|prompts?|rules|"
            r"guidelines)\b",
            _I,
        ),
    ),
    (
        "claims a new identity or system role",
        re.compile(
            r"\b(you are now|from now on,? you (are|will|must)|new system prompt|"
            r"act as the (system|developer))\b"
            r"|\bnew (system )?(instructions|rules|prompt)\s*[:\-\u2014]"
            r"|\byour (new|real|true) (instructions|rules|prompt|role|task)\b"
            r"|<\s*/?\s*system\s*>|\[\s*/?\s*system\s*\]|<\|\s*(im_start|system|endoftext)",
            _I,
        ),
    ),
    (
        "tells the agent to hide from the person",
        re.compile(
            r"\b(do not|don't|never)\s+(tell|inform|mention|reveal|show)[^.\n]{0,30}"
            r"\b(the )?(user|person|owner|operator|human)\b"
            r"|\b(without|never)\s+(telling|informing|asking|notifying|letting)\s+(the )?"
            r"(user|person|owner|operator|human)\b"
            r"|\b(keep|hide)\b[^.\n]{0,30}\bfrom (the )?(user|person|owner|operator|human)\b"
            r"|\b(silently|secretly|covertly)\b[^.\n]{0,40}\b(send|forward|upload|post|"
            r"email|copy|transmit)\b",
            _I,
        ),
    ),
    (
        "reveals the system prompt",
        re.compile(
            r"\b(reveal|print|output|repeat|send|leak|dump)\b[^.\n]{0,30}\b(system prompt|"
            r"system message|your instructions|(initial|original|hidden) (prompt|instructions))",
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
        "uploads a file with curl or wget",
        re.compile(
            # Anchored at the line's start, so a long line is read once, not once per word.
            r"^(?=[^\n]*\b(curl|wget|xh|httpie)\b)[^\n]*?(\s-[a-z]*[dFT]\s*['\"]?[\w.-]*=?@|"
            r"--(data[\w-]*|form[\w-]*)[\s=]+['\"]?[\w.-]*=?@|['\"=\s]@[~/.$\w]|"
            r"--upload-file\b|--post-file\b|--body-file\b)",
            _I | re.MULTILINE,
        ),
    ),
    (
        "reads Herald's configuration or secrets",
        re.compile(
            r"\bherald\.ya?ml\b|(?<![\w-])secrets/|(?<![\w.-])\.env\b"
            r"|\bHERALD_\w*(KEY|TOKEN|SECRET|PASSWORD)\w*|\$\{?HERALD_\w+|\bherald\.db\b"
            r"|(/etc|/var/lib|\.local/state|\.config)/herald\b",
            _I,
        ),
    ),
    (
        "reads credential files",
        re.compile(
            r"(~|\$HOME)/\.(ssh|aws|gnupg|netrc|kube|docker|config/gh)\b|/etc/(passwd|shadow)\b"
            r"|\bid_(rsa|ed25519|ecdsa)\b|\.git-credentials\b|\.pgpass\b|/proc/\w+/environ\b",
            _I,
        ),
    ),
    (
        "pipes environment or files into the network",
        re.compile(r"\b(env|printenv|cat [^|\n]+)\s*\|\s*(curl|wget|nc|netcat)\b", _I),
    ),
    (
        "names a data-catching service",
        re.compile(
            r"\b(webhook\.site|requestbin|pipedream\.net|ngrok(-free)?\.(io|app)|"
            r"burpcollaborator|interact\.sh|oast\.(fun|pro|live|site|online|me))\b",
            _I,
        ),
    ),
)

# Matched against the text with everything but letters and digits removed (lowercase).
_JOINED: tuple[tuple[str, re.Pattern[str]], ...] = (
    (
        "asks to ignore earlier instructions",
        re.compile(
            r"(ignore|disregard|forget|override|bypass|discard)(all|any|every|the|your|of)*"
            r"(previous|prior|above|earlier|preceding|former|original|system|developer)+"
            r"(instructions?|prompts?|rules|guidelines|directives|guidance)"
        ),
    ),
    (
        "claims a new identity or system role",
        re.compile(r"fromnowonyouare|newsystemprompt|newsysteminstructions|yournewinstructions"),
    ),
    (
        "tells the agent to hide from the person",
        re.compile(r"(donot|dont|never)(tell|inform|mention|reveal)(the)?(user|person|operator)"),
    ),
    (
        "reveals the system prompt",
        re.compile(
            r"(reveal|print|output|repeat|leak|dump)(your|the)(system|initial|hidden)prompt"
        ),
    ),
    ("reads Herald's configuration or secrets", re.compile(r"heraldya?ml")),
)

# Look-alikes of Latin letters (from Unicode's confusables.txt, the ones that matter for
# English words), per script: (look-alikes, the Latin letters they pass for).
_LOOKALIKES = (
    ("аеорсхуіјѕԁһӏԛԝвкмнтгпьүѵѡ", "aeopcxyijsdhlqwbkmhtrnbyvw"),  # Cyrillic
    ("АВЕКМНОРСТХУІЈЅӀԌԚԜҮ", "ABEKMHOPCTXYIJSIGQWY"),
    ("αβεικνορτυχγϲϳω", "abeikvoptuxycjw"),  # Greek
    ("ΑΒΕΖΗΙΚΜΝΟΡΤΥΧϹ", "ABEZHIKMNOPTYXC"),
    ("օսհոցզ", "ouhngq"),  # Armenian
    ("ıȷɩɑɡǀ", "ijiagl"),  # Latin letters passing for others
    ("ᴀʙᴄᴅᴇꜰɢʜɪᴊᴋʟᴍɴᴏᴘʀꜱᴛᴜᴠᴡʏᴢ", "abcdefghijklmnoprstuvwyz"),  # small capitals
    ("ᎪᏴᏟᎬᎻᏦᏞᎷᏢᏚᎢᏙᎳᏃᏀᎫᏒᎠ", "ABCEHKLMPSTVWZGJRD"),  # Cherokee
    ("".join(chr(c) for c in range(0x1F1E6, 0x1F200)), "abcdefghijklmnopqrstuvwxyz"),
)
"""The last row: regional indicator letters (pairs of them draw flags)."""
_FOLD = str.maketrans({k: v for a, b in _LOOKALIKES for k, v in zip(a, b, strict=True)})
_LEET = str.maketrans("013457", "oieast")
"""Digits written for letters, tried on the joined text."""
_NON_ALNUM = re.compile(r"[\W_]+")
_BASE64 = re.compile(r"[A-Za-z0-9+/_-]{16,}={0,2}(?:[ \t]*\r?\n[ \t]*[A-Za-z0-9+/_-]{4,}={0,2})*")
_MAX_DEPTH = 2
_HIDDEN = re.compile(
    # Format characters (Unicode's Cf: soft hyphen, zero-width, direction marks and
    # isolates, word joiners, byte-order mark, tags), controls bar tab and newlines,
    # surrogates, the whole tag block, variation selectors 17-256, invisible fillers.
    "[\u00ad\u0600-\u0605\u061c\u06dd\u070f\u0890\u0891\u08e2\u180e\u200b-\u200f"
    "\u202a-\u202e\u2060-\u206f\ufeff\ufff9-\ufffb\U000110bd\U000110cd"
    "\U00013430-\U0001343f\U0001bca0-\U0001bca3\U0001d173-\U0001d17a\U000e0000-\U000e007f"
    "\U000e0100-\U000e01ef\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\ud800-\udfff"
    "\u034f\u115f\u1160\u180b-\u180d\u2800\u3164\uffa0]"
    # One variation selector styles the character before it; a run of them hides bytes.
    "|(?<![^\ufe00-\ufe0f])[\ufe00-\ufe0f]"
)
_MARKS = re.compile(
    "[\u0300-\u036f\u0483-\u0489\u1ab0-\u1aff\u1dc0-\u1dff\u20d0-\u20ff\ufe20-\ufe2f]"
)
"""Combining marks (accents) that decorate Latin, Greek and Cyrillic letters."""


class Verdict(StrEnum):
    """What the scanner makes of a skill."""

    OK = "ok"
    FLAGGED = "flagged"
    """Looks like injection or exfiltration: quarantined, shown to the operator only."""
    REFUSED = "refused"
    """Cannot be read as the model would read it (hidden characters, binary past the cap)."""


@dataclass(frozen=True, slots=True)
class Finding:
    """One flagged (or, with `refused`, refused) passage."""

    reason: str
    excerpt: str
    where: str = "SKILL.md"
    refused: bool = False

    def __str__(self) -> str:
        return f"{self.where}: {self.reason} ({self.excerpt!r})"


def verdict(findings: list[Finding]) -> Verdict:
    """The verdict these findings make: refused beats flagged beats ok."""
    if any(f.refused for f in findings):
        return Verdict.REFUSED
    return Verdict.FLAGGED if findings else Verdict.OK


def hidden_characters(text: str) -> list[str]:
    """The characters of `text` a reader cannot see but a model reads (format, control bar
    tab and newlines, surrogate, tag, filler characters, runs of variation selectors), in
    order; a byte-order mark at the very start is not one."""
    found = _HIDDEN.findall(text)
    if text.startswith("\ufeff"):
        found.pop(0)
    return found


def strip_hidden(text: str) -> str:
    """`text` without its hidden characters."""
    return _HIDDEN.sub("", text)


def reveal(text: str) -> str:
    """`text` with each hidden character written out as `<U+XXXX>`, for the operator to
    read a refused skill safely (a terminal would act on escape sequences)."""
    return _HIDDEN.sub(lambda m: f"<U+{ord(m.group(0)):04X}>", text)


def normalise(text: str) -> str:
    """`text` as a reader sees it: hidden characters dropped, compatibility forms folded
    (NFKC), accents removed and look-alike letters mapped to Latin; HTML character
    references (`Ig&#110;ore`) read as the characters they stand for, as a model reads them."""
    decomposed = unicodedata.normalize("NFKD", strip_hidden(html.unescape(text)))
    return unicodedata.normalize("NFKC", _MARKS.sub("", decomposed).translate(_FOLD))


def scan_text(text: str, where: str = "SKILL.md") -> list[Finding]:
    """The flagged and refused passages of `text` (empty when it looks safe)."""
    found: list[Finding] = []
    hidden = hidden_characters(text)
    if hidden:
        shown = " ".join(f"U+{ord(c):04X}" for c in dict.fromkeys(hidden))
        found.append(
            Finding(
                "holds invisible, tag, direction or control characters", shown[:80], where, True
            )
        )
    tags = "".join(chr(ord(c) - 0xE0000) for c in hidden if 0xE0020 <= ord(c) <= 0xE007E)
    seen: set[str] = set()
    for reason, excerpt in _matches(text + ("\n" + tags if tags else ""), 0):
        stem = reason.split(",", 1)[0]  # one finding per kind: the plainest form found
        if stem not in seen:
            seen.add(stem)
            found.append(Finding(reason, excerpt, where))
    return found


def scan_skill(text: str, front: Mapping[str, object] | None = None) -> list[Finding]:
    """Findings in a whole `SKILL.md`: its text, then its parsed front matter (`front`),
    where YAML escapes such as "\\U000E0069" hide what the raw text does not show."""
    found = scan_text(text)
    if not front:
        return found
    stems = {f.reason.split(",", 1)[0] for f in found}
    parsed = scan_text("\n".join(_strings(front)), "SKILL.md front matter")
    return found + [f for f in parsed if f.reason.split(",", 1)[0] not in stems]


def _strings(value: object) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, Mapping):
        for key, item in value.items():
            yield from _strings(key)
            yield from _strings(item)
    elif isinstance(value, list | tuple):
        for item in value:
            yield from _strings(item)


def _matches(text: str, depth: int) -> Iterator[tuple[str, str]]:
    plain = normalise(text)
    for reason, pattern in _PATTERNS:
        match = pattern.search(plain)
        if match is not None:
            yield reason, " ".join(match.group(0).split())[:80] or repr(match.group(0))
    joined = _NON_ALNUM.sub("", plain).lower()
    leet = joined.translate(_LEET)
    for reason, pattern in _JOINED:
        match = pattern.search(joined) or pattern.search(leet)
        if match is not None:
            yield f"{reason}, letters split apart", match.group(0)[:80]
    if depth >= _MAX_DEPTH:
        return
    for decoded in _base64_texts(text):
        for reason, excerpt in _matches(decoded, depth + 1):
            yield f"{reason}, hidden in base64", excerpt


def _base64_texts(text: str) -> Iterator[str]:
    for match in _BASE64.finditer(text):
        run = re.sub(r"\s+", "", match.group(0)).rstrip("=").replace("-", "+").replace("_", "/")
        run = run[: len(run) - len(run) % 4 if len(run) % 4 == 1 else len(run)]
        try:
            data = base64.b64decode(run + "=" * (-len(run) % 4), validate=True)
        except (binascii.Error, ValueError):
            continue
        decoded = sniff_text(data)
        if decoded is not None and decoded.strip():
            yield decoded


def sniff_text(data: bytes) -> str | None:
    """`data` as text when it is text (UTF-8, or UTF-16/32 with a byte-order mark, and no
    NUL character), else None."""
    for bom, codec in (
        (b"\xff\xfe\x00\x00", "utf-32-le"),
        (b"\x00\x00\xfe\xff", "utf-32-be"),
        (b"\xff\xfe", "utf-16-le"),
        (b"\xfe\xff", "utf-16-be"),
    ):
        if data.startswith(bom):
            try:
                text = data[len(bom) :].decode(codec)
            except UnicodeDecodeError:
                return None
            return None if "\x00" in text else text
    if b"\x00" in data:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


def scan_bytes(data: bytes, where: str) -> list[Finding]:
    """Findings in one supporting file: text (whatever its name) is scanned as text; other
    files are refused past `MAX_BINARY_BYTES`."""
    text = sniff_text(data)
    if text is not None:
        return scan_text(text, where)
    if len(data) > MAX_BINARY_BYTES:
        return [
            Finding(
                f"is not text and larger than {MAX_BINARY_BYTES} bytes (cannot be checked)",
                f"{len(data)} bytes",
                where,
                True,
            )
        ]
    return []
