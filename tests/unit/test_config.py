"""Loading, merging, validating and masking Herald's configuration."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError

from adapters.discord.config import DiscordConfig
from adapters.slack.config import SlackConfig
from adapters.telegram.config import TelegramConfig
from adapters.twilio.config import TwilioConfig
from gateway.access import Access
from gateway.config import AccessConfig, HeraldConfig, load_config, masked
from gateway.contracts.errors import ConfigError


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """No `HERALD_*` variable of the machine running the tests; a private home directory."""
    for name in list(os.environ):
        if name.upper().startswith("HERALD_"):
            monkeypatch.delenv(name)
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    return home


def write(path: Path, text: str) -> Path:
    """Write `text` to `path` and return the path."""
    path.write_text(text, encoding="utf-8")
    return path


def config_file(tmp_path: Path, text: str) -> Path:
    """A YAML config file holding `text`."""
    return write(tmp_path / "herald.yaml", text)


def load_error(path: Path | None = None) -> str:
    """The message of the ConfigError that loading `path` raises."""
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    return str(caught.value)


# defaults ----------------------------------------------------------------------------------------


def test_defaults_without_a_file_or_environment(clean_environment: Path) -> None:
    config = load_config(None)

    state_dir = clean_environment / ".local" / "state" / "herald"
    assert config.state_dir == state_dir
    assert config.effective_database_url == f"sqlite+aiosqlite:///{state_dir / 'herald.db'}"
    assert config.api.host == "127.0.0.1"
    assert config.api.port == 8642
    assert config.api.key is None
    assert config.llm.compression_threshold == 0.5
    assert config.llm.effective_provider == "echo"
    assert config.home.targets == ()


def test_an_empty_file_gives_the_defaults(tmp_path: Path) -> None:
    assert load_config(config_file(tmp_path, "")) == load_config(None)


def test_herald_home_is_the_state_dir_and_not_the_home_section(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("HERALD_HOME", str(tmp_path / "herald-home"))

    config = load_config(None)

    assert config.state_dir == tmp_path / "herald-home"
    assert config.effective_database_url == (
        f"sqlite+aiosqlite:///{tmp_path / 'herald-home' / 'herald.db'}"
    )
    assert config.home.targets == ()


def test_herald_home_targets_sets_the_home_section_next_to_herald_home(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("HERALD_HOME", str(tmp_path / "herald-home"))
    monkeypatch.setenv("HERALD_HOME__TARGETS", '["telegram:42", "slack:C1:T9"]')

    config = load_config(None)

    assert config.state_dir == tmp_path / "herald-home"
    assert config.home.targets == ("telegram:42", "slack:C1:T9")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("home: telegram:123456789\n", ("telegram:123456789",)),
        ("home:\n  targets: telegram:123456789\n", ("telegram:123456789",)),
        ('home:\n  targets: "telegram:1, slack:C1"\n', ("telegram:1", "slack:C1")),
        ("home:\n  targets: [telegram:1, slack:C1]\n", ("telegram:1", "slack:C1")),
    ],
)
def test_home_targets_as_people_write_them(
    tmp_path: Path, text: str, expected: tuple[str, ...]
) -> None:
    assert load_config(config_file(tmp_path, text)).home.targets == expected


def test_state_dir_in_the_file_wins_over_herald_home_and_expands_the_user(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, clean_environment: Path
) -> None:
    monkeypatch.setenv("HERALD_HOME", str(tmp_path / "herald-home"))

    config = load_config(config_file(tmp_path, "state_dir: ~/herald-state\n"))

    assert config.state_dir == clean_environment / "herald-state"


# the file and the environment --------------------------------------------------------------------


def test_herald_config_names_the_file(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("HERALD_CONFIG", str(config_file(tmp_path, "api: {port: 9001}\n")))

    assert load_config(None).api.port == 9001


def test_an_explicit_path_wins_over_herald_config(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("HERALD_CONFIG", str(write(tmp_path / "env.yaml", "api: {port: 9001}\n")))

    assert load_config(write(tmp_path / "flag.yaml", "api: {port: 9002}\n")).api.port == 9002


def test_environment_beats_the_file_and_keeps_the_rest_of_the_section(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    path = config_file(
        tmp_path,
        "api: {host: localhost, port: 9000, model_name: from-yaml}\nlog_level: WARNING\n",
    )
    monkeypatch.setenv("HERALD_API__PORT", "9100")
    monkeypatch.setenv("HERALD_LOG_LEVEL", "DEBUG")

    config = load_config(path)

    assert config.api.port == 9100
    assert config.api.host == "localhost"
    assert config.api.model_name == "from-yaml"
    assert config.log_level == "DEBUG"


def test_environment_names_are_case_insensitive(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("herald_llm__model", "small-model")

    assert load_config(None).llm.model == "small-model"


# validation errors name the key ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "env", "key"),
    [
        pytest.param("api: {port: 70000}\n", {}, "api.port", id="port-out-of-range"),
        pytest.param("", {"HERALD_API__PORT": "eighty"}, "api.port", id="port-from-env"),
        pytest.param(
            "llm: {compression_threshold: 1.5}\n",
            {},
            "llm.compression_threshold",
            id="threshold",
        ),
        pytest.param("llm: {modle: gpt-4o}\n", {}, "llm.modle", id="unknown-key-in-file"),
        pytest.param("", {"HERALD_LLM__MODLE": "gpt-4o"}, "llm.modle", id="unknown-key-in-env"),
        pytest.param("colour: blue\n", {}, "colour", id="unknown-section"),
        pytest.param("home: {targets: [telegram]}\n", {}, "home.targets", id="bad-target"),
        pytest.param(
            "sessions: {busy_mode: shout}\n", {}, "sessions.busy_mode", id="bad-busy-mode"
        ),
    ],
)
def test_a_bad_value_is_refused_naming_its_key(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, text: str, env: dict[str, str], key: str
) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value)

    message = load_error(config_file(tmp_path, text))

    assert message.startswith("invalid configuration:")
    assert f"  {key}: " in message


def test_every_bad_key_is_named_at_once(tmp_path: Path) -> None:
    message = load_error(
        config_file(tmp_path, "api: {port: -1}\nllm: {compression_threshold: 0, modle: x}\n")
    )

    assert "api.port" in message
    assert "llm.compression_threshold" in message
    assert "llm.modle" in message


# secrets from files ------------------------------------------------------------------------------


def test_a_secret_from_a_file_named_in_the_yaml(tmp_path: Path) -> None:
    secret = write(tmp_path / "api.key", "s3cret-api-key\n")

    config = load_config(config_file(tmp_path, f"api: {{key_file: {secret}}}\n"))

    assert config.api.key is not None
    assert config.api.key.get_secret_value() == "s3cret-api-key"


def test_a_nested_secret_from_a_file_named_in_the_environment(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("HERALD_LLM__API_KEY_FILE", str(write(tmp_path / "llm.key", "sk-1\r\n")))

    config = load_config(None)

    assert config.llm.api_key is not None
    assert config.llm.api_key.get_secret_value() == "sk-1"
    assert config.llm.effective_provider == "openai"


def test_the_database_url_from_a_file_named_in_the_environment(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    url = "postgresql+asyncpg://herald:pw@db.internal/herald"
    monkeypatch.setenv("HERALD_DATABASE_URL_FILE", str(write(tmp_path / "db.url", url + "\n")))

    assert load_config(None).database_url == url


def test_the_database_url_from_a_file_named_in_the_yaml(tmp_path: Path) -> None:
    url = "postgresql+asyncpg://herald:pw@db.internal/herald"
    secret = write(tmp_path / "db.url", url + "\n")

    assert load_config(config_file(tmp_path, f"database_url_file: {secret}\n")).database_url == url


def test_only_trailing_newlines_of_a_secret_file_are_stripped(tmp_path: Path) -> None:
    secret = write(tmp_path / "api.key", "  spaced key\t\n\n")

    config = load_config(config_file(tmp_path, f"api: {{key_file: {secret}}}\n"))

    assert config.api.key is not None
    assert config.api.key.get_secret_value() == "  spaced key\t"


@pytest.mark.parametrize(
    ("text", "env", "name"),
    [
        pytest.param("api: {key_file: MISSING}\n", {}, "key_file", id="yaml-nested"),
        pytest.param("database_url_file: MISSING\n", {}, "database_url_file", id="yaml-top"),
        pytest.param("", {"HERALD_LLM__API_KEY_FILE": "MISSING"}, "api_key_file", id="env-nested"),
        pytest.param(
            "", {"HERALD_DATABASE_URL_FILE": "MISSING"}, "database_url_file", id="env-top"
        ),
    ],
)
def test_an_unreadable_secret_file_is_a_config_error_naming_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, text: str, env: dict[str, str], name: str
) -> None:
    missing = str(tmp_path / "no-such-secret")
    for variable, value in env.items():
        monkeypatch.setenv(variable, value.replace("MISSING", missing))

    message = load_error(config_file(tmp_path, text.replace("MISSING", missing)))

    assert f"{name}: cannot read {missing}" in message


def test_the_environment_beats_a_secret_file_named_in_the_yaml(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    secret = write(tmp_path / "api.key", "from-yaml-file\n")
    monkeypatch.setenv("HERALD_API__KEY", "from-env")

    config = load_config(config_file(tmp_path, f"api: {{key_file: {secret}}}\n"))

    assert config.api.key is not None
    assert config.api.key.get_secret_value() == "from-env"


# cross-field rules -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "host",
    ["0.0.0.0", "192.0.2.10", "::", "herald.example.org"],  # noqa: S104 - the point of the test
)
def test_a_non_loopback_api_needs_a_key(tmp_path: Path, host: str) -> None:
    message = load_error(config_file(tmp_path, f"api: {{host: '{host}'}}\n"))

    assert "api.key" in message


@pytest.mark.parametrize("host", ["127.0.0.1", "127.0.0.2", "::1", "localhost"])
def test_a_loopback_api_needs_no_key(tmp_path: Path, host: str) -> None:
    config = load_config(config_file(tmp_path, f"api: {{host: '{host}'}}\n"))

    assert config.api.is_loopback


def test_a_non_loopback_api_with_a_key_is_accepted(tmp_path: Path) -> None:
    config = load_config(config_file(tmp_path, "api: {host: 0.0.0.0, key: k-123}\n"))

    assert not config.api.is_loopback


def test_a_disabled_api_needs_no_key_on_any_host(tmp_path: Path) -> None:
    config = load_config(config_file(tmp_path, "api: {enabled: false, host: 0.0.0.0}\n"))

    assert not config.api.enabled


def test_an_empty_key_from_a_file_is_no_key_off_loopback(tmp_path: Path) -> None:
    empty = write(tmp_path / "api.key", "\n")

    message = load_error(config_file(tmp_path, f"api: {{host: 0.0.0.0, key_file: {empty}}}\n"))

    assert "api.key" in message


@pytest.mark.parametrize(
    "url",
    [
        "mysql://herald@db/herald",
        "sqlite:///herald.db",
        "postgresql://herald@db/herald",
        "postgresql+psycopg://herald@db/herald",
    ],
)
def test_a_database_url_with_another_scheme_is_refused(tmp_path: Path, url: str) -> None:
    message = load_error(config_file(tmp_path, f"database_url: '{url}'\n"))

    assert "  database_url: must start with sqlite+aiosqlite:// or postgresql+asyncpg://" in (
        message
    )


@pytest.mark.parametrize(
    "url", ["sqlite+aiosqlite:////var/lib/herald/h.db", "postgresql+asyncpg://h@db:5432/h"]
)
def test_a_database_url_with_a_supported_scheme_is_used(tmp_path: Path, url: str) -> None:
    config = load_config(config_file(tmp_path, f"database_url: '{url}'\n"))

    assert config.effective_database_url == url


@pytest.mark.parametrize(
    ("text", "provider"),
    [
        pytest.param("", "echo", id="nothing"),
        pytest.param("llm: {base_url: 'http://127.0.0.1:8000/v1'}\n", "openai", id="base_url"),
        pytest.param("llm: {api_key: sk-x}\n", "openai", id="api_key"),
        pytest.param("llm: {provider: echo, api_key: sk-x}\n", "echo", id="forced-echo"),
        pytest.param("llm: {provider: openai}\n", "openai", id="forced-openai"),
    ],
)
def test_the_effective_provider(tmp_path: Path, text: str, provider: str) -> None:
    assert load_config(config_file(tmp_path, text)).llm.effective_provider == provider


# frozen ------------------------------------------------------------------------------------------


def test_the_config_is_frozen() -> None:
    config = load_config(None)

    with pytest.raises(ValidationError, match="frozen"):
        config.log_level = "DEBUG"  # type: ignore[misc]
    with pytest.raises(ValidationError, match="frozen"):
        config.api.port = 1  # type: ignore[misc]
    assert isinstance(config, HeraldConfig)
    assert config.api.port == 8642


# masked ------------------------------------------------------------------------------------------


def test_masked_replaces_every_secret(tmp_path: Path) -> None:
    path = config_file(
        tmp_path,
        "database_url: 'postgresql+asyncpg://herald:db-pass-123@db.internal:5432/herald'\n"
        "llm: {api_key: sk-live-llm-456}\n"
        "api: {host: 0.0.0.0, key: api-key-789}\n",
    )

    data = masked(load_config(path))

    assert data["llm"]["api_key"] == "***"
    assert data["api"]["key"] == "***"
    assert data["database_url"] == "postgresql+asyncpg://herald:***@db.internal:5432/herald"
    dumped = yaml.safe_dump(data)
    for secret in ("db-pass-123", "sk-live-llm-456", "api-key-789"):
        assert secret not in dumped


def test_masked_is_plain_data_with_the_effective_values(tmp_path: Path) -> None:
    config = load_config(config_file(tmp_path, "home: {targets: ['telegram:1']}\n"))

    data = masked(config)

    assert yaml.safe_load(yaml.safe_dump(data)) == data
    assert data["database_url"] == config.effective_database_url
    assert data["state_dir"] == str(config.state_dir)
    assert data["llm"]["provider"] == "echo"
    assert data["llm"]["api_key"] is None
    assert data["sessions"]["busy_mode"] == "queue"
    assert data["home"]["targets"] == ["telegram:1"]
    assert data["instance_id"] == config.effective_instance_id


def test_masked_keeps_a_password_containing_at_signs_hidden(tmp_path: Path) -> None:
    url = "postgresql+asyncpg://herald:p@ss:w/rd@db.internal/herald"

    data = masked(load_config(config_file(tmp_path, f"database_url: '{url}'\n")))

    assert data["database_url"] == "postgresql+asyncpg://herald:***@db.internal/herald"


def test_masked_hides_a_password_given_as_a_query_parameter(tmp_path: Path) -> None:
    url = "postgresql+asyncpg://herald@db.internal/herald?password=db-pass-123"

    data = masked(load_config(config_file(tmp_path, f"database_url: '{url}'\n")))

    assert "db-pass-123" not in data["database_url"]


# the file itself ---------------------------------------------------------------------------------


def test_a_missing_file_is_a_config_error(tmp_path: Path) -> None:
    path = tmp_path / "nowhere.yaml"

    message = load_error(path)

    assert message == f"cannot read config file {path}: No such file or directory"


def test_invalid_yaml_is_a_config_error(tmp_path: Path) -> None:
    path = config_file(tmp_path, "api: {port: [\n")

    message = load_error(path)

    assert message.startswith(f"config file {path} is not valid YAML:")


@pytest.mark.parametrize("text", ["- api\n- llm\n", "just a string\n", "42\n"])
def test_a_top_level_that_is_not_a_mapping_is_a_config_error(tmp_path: Path, text: str) -> None:
    path = config_file(tmp_path, text)

    assert load_error(path) == f"config file {path} must hold a mapping at the top level"


def test_telegram_webhook_mode_needs_its_url_secret_and_the_http_server() -> None:
    base = {"token": "1:x", "mode": "webhook"}
    with pytest.raises(ValidationError, match="needs webhook_url and webhook_secret"):
        HeraldConfig.model_validate({"platforms": {"telegram": base}})
    section = {**base, "webhook_url": "https://bot.example.org/webhooks/telegram"}
    with pytest.raises(ValidationError, match="1-256 characters"):
        HeraldConfig.model_validate(
            {"platforms": {"telegram": {**section, "webhook_secret": "no spaces"}}}
        )
    section["webhook_secret"] = "s3cret_-X"
    with pytest.raises(ValidationError, match="needs the HTTP server"):
        HeraldConfig.model_validate({"api": {"enabled": False}, "platforms": {"telegram": section}})
    config = HeraldConfig.model_validate({"platforms": {"telegram": section}})
    telegram = config.platforms.section(TelegramConfig)
    assert telegram is not None
    assert telegram.mode == "webhook"


def test_telegram_group_trigger_takes_one_or_several() -> None:
    one = HeraldConfig.model_validate(
        {"platforms": {"telegram": {"token": "1:x", "group_trigger": "all"}}}
    )
    telegram = one.platforms.section(TelegramConfig)
    assert telegram is not None
    assert telegram.group_trigger == ("all",)
    with pytest.raises(ValidationError, match="group_trigger"):
        HeraldConfig.model_validate(
            {"platforms": {"telegram": {"token": "1:x", "group_trigger": ["sometimes"]}}}
        )


# ids and home as people write them ---------------------------------------------------------------


def test_numeric_ids_in_yaml_are_stored_as_strings(tmp_path: Path) -> None:
    config = load_config(
        config_file(
            tmp_path,
            "platforms:\n"
            "  telegram: {token: '1:x', allowed_users: [111222333, '444']}\n"
            "  discord: {token: d, allowed_roles: [5550001], channels: 7770001}\n"
            "  slack: {bot_token: b, app_token: a, channels: [C01, 42]}\n",
        )
    )

    telegram = config.platforms.section(TelegramConfig)
    discord = config.platforms.section(DiscordConfig)
    slack = config.platforms.section(SlackConfig)
    assert telegram is not None
    assert discord is not None
    assert slack is not None
    assert telegram.allowed_users == ("111222333", "444")
    assert discord.allowed_roles == ("5550001",)
    assert discord.channels == ("7770001",)
    assert slack.channels == ("C01", "42")


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        pytest.param("111222333", ("111222333",), id="one"),
        pytest.param("111, 222", ("111", "222"), id="comma-separated"),
        pytest.param('["111", 222]', ("111", "222"), id="json"),
    ],
)
def test_ids_from_the_environment(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, value: str, expected: tuple[str, ...]
) -> None:
    monkeypatch.setenv("HERALD_PLATFORMS__TELEGRAM__ALLOWED_USERS", value)

    config = load_config(config_file(tmp_path, "platforms: {telegram: {token: '1:x'}}\n"))

    telegram = config.platforms.section(TelegramConfig)
    assert telegram is not None
    assert telegram.allowed_users == expected


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("telegram:1,Telegram:2", ("telegram:1", "telegram:2")),
        ('["telegram:1"]', ("telegram:1",)),
    ],
)
def test_operators_from_the_environment(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, value: str, expected: tuple[str, ...]
) -> None:
    monkeypatch.setenv("HERALD_ACCESS__OPERATORS", value)

    assert load_config(config_file(tmp_path, "{}\n")).access.operators == expected


def test_an_operator_is_a_platform_and_an_id(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not of the form platform:id"):
        load_config(config_file(tmp_path, "access: {operators: [111222333]}\n"))


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param("home: telegram:123456789\n", ("telegram:123456789",), id="one"),
        pytest.param("home: [telegram:1, 'slack:C2']\n", ("telegram:1", "slack:C2"), id="list"),
        pytest.param("home: {targets: [telegram:1]}\n", ("telegram:1",), id="section"),
    ],
)
def test_home_takes_a_target_or_a_list_beside_the_section(
    tmp_path: Path, text: str, expected: tuple[str, ...]
) -> None:
    assert load_config(config_file(tmp_path, text)).home.targets == expected


def test_an_unknown_key_suggests_a_close_known_one(tmp_path: Path) -> None:
    message = load_error(
        config_file(
            tmp_path,
            "llmm: {}\nplatforms:\n  telegram: {token: '1:x', allowd_users: [1]}\n  tset: {}\n",
        )
    )

    assert "  llmm: unknown key; did you mean 'llm'?" in message
    assert (
        "  platforms.telegram.allowd_users: unknown key; did you mean 'allowed_users'?" in message
    )
    assert (
        "  platforms.tset: unknown key (known: telegram, slack, twilio, discord, email, matrix, "
        "mattermost, signal)" in message
    )


def test_a_whole_config_error_has_no_key_prefix(tmp_path: Path) -> None:
    message = load_error(config_file(tmp_path, "api: {host: 0.0.0.0}\n"))

    assert message == (
        "invalid configuration:\n  api.key is required when api.host is '0.0.0.0' (not loopback)"
    )


def test_masked_leaves_out_the_unused_test_platform(tmp_path: Path) -> None:
    assert "test" not in masked(load_config(None))["platforms"]
    used = load_config(config_file(tmp_path, "platforms: {test: {url: 'http://x', token: t}}\n"))
    assert "test" in masked(used)["platforms"]


def test_a_report_heading_with_an_unknown_field_is_refused(tmp_path: Path) -> None:
    message = load_error(config_file(tmp_path, "cron: {report_heading: '{title}'}\n"))

    assert "  cron.report_heading: '{title}' is not a heading template" in message


def test_unquoted_phone_numbers_in_yaml_keep_their_plus(tmp_path: Path) -> None:
    config = load_config(
        config_file(
            tmp_path,
            "platforms:\n"
            "  twilio:\n"
            f"    account_sid: AC{'0' * 32}\n"
            "    auth_token: t\n"
            "    public_url: https://herald.example.org\n"
            "    from_number: +15550001111\n"
            "    allowed_numbers: [+15551234567]\n",
        )
    )

    twilio = config.platforms.section(TwilioConfig)
    assert twilio is not None
    assert twilio.from_number == "+15550001111"
    assert twilio.allowed_numbers == ("+15551234567",)
    assert "+15551234567" in twilio.allowed_users


EMAIL = (
    "platforms:\n  email:\n    imap_host: imap.example.test\n    smtp_host: smtp.example.test\n"
    "    username: herald@example.com\n    password: pw\n    address: herald@example.com\n"
)


def test_an_email_operator_needs_authenticated_mail(tmp_path: Path) -> None:
    """Anyone can write a mail's From: an email identity is an operator only where the
    receiving server's authentication results are required."""
    operators = "access: {operators: ['email:boss@example.com']}\n"
    message = load_error(config_file(tmp_path, EMAIL + operators))
    assert "access.operators: 'email:boss@example.com'" in message
    assert "require_authentication_results" in message

    vouched = EMAIL + (
        "    require_authentication_results: true\n    authserv_id: mx.example.com\n"
    )
    loaded = load_config(config_file(tmp_path, vouched + operators))
    assert loaded.access.operators == ("email:boss@example.com",)
    access = Access(None, loaded.platforms.accounts(), loaded.access)  # type: ignore[arg-type]
    assert access.is_operator("email", "boss@example.com")

    unvouched = load_config(config_file(tmp_path, EMAIL))
    config = AccessConfig(operators=("email:boss@example.com",))
    access = Access(None, unvouched.platforms.accounts(), config)  # type: ignore[arg-type]
    assert not access.is_operator("email", "boss@example.com")  # a claim, never operator
