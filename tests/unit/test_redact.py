"""`gateway.redact`: the secrets of a config, and the filter that keeps them out of every log
record (message, arguments, traceback) at every level."""

from __future__ import annotations

import io
import logging
from collections.abc import Iterator

import pytest

from gateway.config import HeraldConfig
from gateway.redact import (
    URL_LOGGERS,
    RedactingFilter,
    Redactor,
    SecretStream,
    install,
    secrets_of,
)

TOKEN = "8101123456789:AAH-unit-secret-telegram-token-0123456789"


def config() -> HeraldConfig:
    return HeraldConfig(
        state_dir="/tmp/unused",  # noqa: S108 - never touched
        database_url="postgresql+asyncpg://herald:db-secret-pw@db.internal/herald",
        llm={"api_key": "sk-unit-llm-key"},
        api={"key": "unit-api-key"},
        platforms={
            "telegram": {"token": TOKEN, "webhook_secret": "unit-webhook-secret"},
            "email": {
                "imap_host": "mail",
                "smtp_host": "mail",
                "username": "u",
                "address": "u@example.com",
                "password": "unit-mail-password",
            },
        },
    )


def test_secrets_of_finds_every_secret_of_the_config() -> None:
    found = set(secrets_of(config(), config().effective_database_url))

    assert found == {
        TOKEN,
        "unit-webhook-secret",
        "sk-unit-llm-key",
        "unit-api-key",
        "unit-mail-password",
        "db-secret-pw",
    }


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        # The whole token, where a base_url without /bot puts it (after the port).
        (f"InvalidURL(\"Invalid port: '1{TOKEN}'\")", "InvalidURL(\"Invalid port: '1***'\")"),
        (
            f"Set Bot API URL: https://api.telegram.org/bot{TOKEN}",
            "Set Bot API URL: https://api.telegram.org/bot***",
        ),
        # URL-encoded.
        (f"GET /bot8101123456789%3A{TOKEN.split(':')[1]}/getMe", "GET /bot***/getMe"),
        # The secret half alone.
        (f"token ...:{TOKEN.split(':')[1]}", "token ...:***"),
        ("login with unit-mail-password failed", "login with *** failed"),
    ],
)
def test_the_config_redactor_hides_each_form(text: str, expected: str) -> None:
    redact = Redactor(secrets_of(config()))

    assert redact(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "https://api.telegram.org/bot123456:ABCdef-ghi_jkl/getUpdates",
            "https://api.telegram.org/bot123456:***/getUpdates",
        ),
        (
            "Invalid port: '99999999:AAHabcdefghijklmnopqrstuvwxyz012345'",
            "Invalid port: '99999999:***'",
        ),
        ("token xoxb-123-456-abcDEF refused", "token xoxb-*** refused"),
        ("postgresql://herald:s3cret@db/herald", "postgresql://herald:***@db/herald"),
        ("Authorization: Bearer abc.def.ghi", "Authorization: Bearer ***"),
        (
            "GET https://llm/v1/models?api-key=abc123&x=1",
            "GET https://llm/v1/models?api-key=***&x=1",
        ),
        ("nothing secret here: 12:30, bot 5", "nothing secret here: 12:30, bot 5"),
        # An account named bot1 in a session key is not a Bot API path.
        ("Session test:bot1:c-ann:u=u-ann", "Session test:bot1:c-ann:u=u-ann"),
    ],
)
def test_credential_shapes_are_hidden_without_a_config(text: str, expected: str) -> None:
    assert Redactor()(text) == expected


@pytest.fixture
def logged() -> Iterator[tuple[logging.Logger, io.StringIO]]:
    """A logger at DEBUG whose only handler writes to a buffer, with the redactor installed."""
    buffer = io.StringIO()
    handler = logging.StreamHandler(buffer)
    handler.setFormatter(logging.Formatter("%(levelname)s %(message)s"))
    root = logging.Logger("redact-test-root", logging.DEBUG)
    root.addHandler(handler)
    install(Redactor(secrets_of(config())), root=root)
    yield root, buffer
    root.removeHandler(handler)


def test_a_record_s_arguments_and_traceback_are_redacted(
    logged: tuple[logging.Logger, io.StringIO],
) -> None:
    log, buffer = logged

    log.debug("Set Bot API URL: %s", f"https://api.telegram.org/bot{TOKEN}")
    try:
        raise ValueError(f"Invalid port: '{TOKEN}'")
    except ValueError:
        log.exception("adapter telegram failed with %r", TOKEN)

    text = buffer.getvalue()
    assert TOKEN not in text
    assert TOKEN.split(":")[1] not in text
    assert "DEBUG Set Bot API URL: https://api.telegram.org/bot***" in text
    assert "ValueError: Invalid port: '***'" in text  # the traceback is kept, redacted


def test_installing_again_replaces_the_redactor(
    logged: tuple[logging.Logger, io.StringIO],
) -> None:
    log, buffer = logged

    install(Redactor(["another-secret"]), root=log)
    log.info("another-secret and unit-mail-password")

    (handler,) = log.handlers
    assert len([f for f in handler.filters if isinstance(f, RedactingFilter)]) == 1
    assert buffer.getvalue() == "INFO *** and unit-mail-password\n"


def test_install_turns_the_url_loggers_down_to_warning(
    logged: tuple[logging.Logger, io.StringIO],
) -> None:
    for name in ("httpx", "httpx2", "httpcore", "openai", "telegram.Bot", "aiohttp.access"):
        assert name in URL_LOGGERS
        assert logging.getLogger(name).level == logging.WARNING


def test_secrets_of_finds_the_keys_of_every_service_and_free_form_options() -> None:
    cfg = HeraldConfig(
        state_dir="/tmp/unused",  # noqa: S108 - never touched
        llm={"transcription": {"base_url": "http://speech", "api_key": "unit-speech-key"}},
        memory={
            "provider": "mem0",
            "mem0": {"api_key": "unit-mem0-key"},
            "options": {"auth": "none", "nested": {"api_token": "unit-option-token"}},
        },
        mcp={
            "servers": {
                "local": {"command": "x", "env": {"SERVICE_TOKEN": "unit-mcp-env"}},
                "remote": {"url": "https://r/mcp", "headers": {"Authorization": "Bearer unit-hdr"}},
            }
        },
    )
    redact = Redactor.of(cfg)

    found = set(secrets_of(cfg))
    assert {"unit-speech-key", "unit-mem0-key", "unit-option-token", "unit-mcp-env"} <= found
    assert "none" not in found  # a short free-form value is a setting, not a secret
    # A header's token alone (a service quoting it without its scheme) is found too.
    assert redact("refused token unit-hdr") == "refused token ***"
    assert redact.data({"a": ["unit-mem0-key", 1], "b": None}) == {"a": ["***", 1], "b": None}


@pytest.mark.parametrize("size", [1, 2, 3, 5, 7, 64])
def test_a_secret_split_over_streamed_pieces_never_leaves(size: int) -> None:
    secret = "sk-streamed-secret-0123"
    text = f"the key is {secret}, and {secret[:6]} alone is not a key: sk-"
    stream = SecretStream(Redactor([secret]))
    pieces = [text[i : i + size] for i in range(0, len(text), size)]
    shown = [stream.feed(p) for p in pieces] + [stream.flush()]

    assert "".join(shown) == "the key is ***, and sk-str alone is not a key: sk-"
    assert not any(secret[:12] in "".join(shown[: n + 1]) for n in range(len(shown)))


def test_what_people_read_keeps_words_a_careless_short_secret_matches() -> None:
    redact = Redactor(["herald", "a-long-enough-secret"])

    assert redact("herald says a-long-enough-secret") == "*** says ***"  # the log
    assert redact.secrets("herald says a-long-enough-secret") == "herald says ***"
    stream = SecretStream(redact)
    assert stream.feed("herald ") == "herald "  # not held back as a secret's beginning


def test_a_secret_written_with_markdown_escapes_is_hidden_too() -> None:
    """An answer is redacted as Markdown, before the platform's renderer drops its escapes:
    `sk\\_live\\-…` shows as `sk_live-…`, so it must be caught in that form too."""
    redactor = Redactor(["sk_live-0123.4567"])
    escaped = r"the key is sk\_live\-0123\.4567, see"
    assert redactor(escaped) == "the key is ***, see"
    assert redactor.secrets(escaped) == "the key is ***, see"
    assert redactor.secrets("sk_live-0123.4567") == "***"
    assert redactor.secrets(r"sk\\_live-0123.4567") == r"sk\\_live-0123.4567"  # a backslash shown
