"""`herald setup` driven through a pseudo-terminal (pexpect) against the platform fakes:
the credentials are checked live, secrets land in 0600 files, an existing file keeps its
comments, and a refusal or Ctrl-C writes nothing."""

from __future__ import annotations

import asyncio
import stat
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pexpect
import pytest
import yaml
from typer.testing import CliRunner, Result

from gateway.cli.main import app
from gateway.config import load_config
from tests.e2e.daemon import HERALD
from tests.fakes.discord_server import FakeDiscordServer
from tests.fakes.dovecot import PASSWORD as DOVECOT_PASSWORD
from tests.fakes.dovecot import USER as DOVECOT_USER
from tests.fakes.dovecot import Dovecot
from tests.fakes.llm import FakeLLM
from tests.fakes.mattermost_server import BOT_ID, BOT_NAME, FakeMattermostServer
from tests.fakes.mattermost_server import TOKEN as MATTERMOST_TOKEN
from tests.fakes.signal_cli import FakeSignalCli
from tests.fakes.slack import DEFAULT_APP_TOKEN, DEFAULT_BOT_TOKEN, FakeSlackServer
from tests.fakes.smtp_server import SmtpServer
from tests.fakes.synapse import shared_synapse
from tests.fakes.telegram import FakeTelegramServer
from tests.fakes.twilio_server import FakeTwilioServer

pytestmark = pytest.mark.timeout(90)

TOKEN = "123456:setup-test-token-abcdefghijklmnopqrstuvwxyz"
WAIT = 20.0

EXISTING = """\
# Herald at home: keep this comment
log_level: DEBUG  # chatty for now

sessions:
  busy_mode: steer  # I like steering
  queue_cap: 7
"""


@pytest.fixture
async def tg() -> AsyncIterator[FakeTelegramServer]:
    async with FakeTelegramServer(TOKEN, bot_username="herald_setup_bot") as server:
        yield server


@pytest.fixture
async def llm() -> AsyncIterator[FakeLLM]:
    async with FakeLLM() as server:
        yield server


def environment(tmp_path: Path) -> dict[str, str]:
    return {
        "PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin",
        "HOME": str(tmp_path),
        "TERM": "dumb",
        "COLUMNS": "200",
        "NO_COLOR": "1",
    }


class Terminal:
    """`herald setup` in a pseudo-terminal; pexpect's blocking calls run in a thread, so
    the fakes keep serving on this event loop."""

    def __init__(self, tmp_path: Path, *args: str) -> None:
        self.child = pexpect.spawn(
            str(HERALD),
            ["setup", *args],
            cwd=str(tmp_path),
            env=environment(tmp_path),
            encoding="utf-8",
            timeout=WAIT,
            dimensions=(50, 200),
        )
        self.seen: list[str] = []

    async def expect(self, pattern: str) -> str:
        try:
            await asyncio.to_thread(self.child.expect, pattern)
        except (pexpect.TIMEOUT, pexpect.EOF) as err:
            raise AssertionError(
                f"expected {pattern!r}; the terminal showed:\n{''.join(self.seen)}"
                f"{self.child.before}"
            ) from err
        self.seen.append(f"{self.child.before}{self.child.after}")
        return str(self.child.before)

    async def answer(self, prompt: str, text: str) -> None:
        await self.expect(prompt)
        await asyncio.to_thread(self.child.sendline, text)

    async def interrupt(self) -> None:
        await asyncio.to_thread(self.child.sendintr)

    async def exit_code(self) -> int:
        await asyncio.to_thread(self.child.expect, pexpect.EOF)
        self.seen.append(str(self.child.before))
        await asyncio.to_thread(self.child.close)
        code = self.child.exitstatus
        assert code is not None, "".join(self.seen)
        return int(code)


async def full_interview(term: Terminal, llm: FakeLLM, token: str = TOKEN) -> None:
    await term.answer(r"Platform to set up", "telegram")
    await term.answer(r"Bot token from @BotFather", token)
    await term.expect(r"herald_setup_bot")
    await term.answer(r"Who may talk to the agent", "111, 222")
    await term.answer(r"pairing code", "y")
    await term.answer(r"Home channel", "telegram:111")
    await term.answer(r"Model endpoint", llm.base_url)
    await term.answer(r"Its API key", "sk-setup-key")
    await term.answer(r"Model name", "fake-model")
    await term.expect(r"'fake-model' listed")
    await term.answer(r"Write .*herald\.yaml\?", "y")


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def read(path: Path | str) -> str:
    return Path(path).read_text(encoding="utf-8")


def listing(path: Path) -> list[str]:
    return sorted(p.name for p in path.iterdir())


async def test_a_good_token_is_checked_and_saved_with_secrets_in_0600_files(
    tmp_path: Path, tg: FakeTelegramServer, llm: FakeLLM
) -> None:
    config = tmp_path / "herald.yaml"
    term = Terminal(tmp_path, "--base-url", tg.base_url)
    await full_interview(term, llm)
    assert await term.exit_code() == 0, "".join(term.seen)
    text = read(config)
    assert TOKEN not in text
    assert "sk-setup-key" not in text
    data = yaml.safe_load(text)
    section = data["platforms"]["telegram"]
    token_file = Path(section["token_file"])
    assert read(token_file) == TOKEN + "\n"
    assert mode(token_file) == 0o600
    assert mode(token_file.parent) == 0o700
    assert mode(Path(data["llm"]["api_key_file"])) == 0o600
    assert section["allowed_users"] == ["111", "222"]
    assert section["pairing"] is True
    assert data["home"] == "telegram:111"
    loaded = load_config(config)  # what `herald run` will read
    telegram = loaded.platforms.accounts()[("telegram", "default")]
    assert telegram.allowed_users == ("111", "222")
    assert loaded.llm.api_key is not None
    assert loaded.llm.api_key.get_secret_value() == "sk-setup-key"
    assert loaded.llm.base_url == llm.base_url
    assert loaded.home.targets == ("telegram:111",)
    assert [c.method for c in tg.calls] == ["getMe"]  # checked, nothing taken over


async def test_a_bad_token_is_refused_with_the_platforms_reason_and_nothing_written(
    tmp_path: Path, tg: FakeTelegramServer
) -> None:
    term = Terminal(tmp_path, "--base-url", tg.base_url)
    await term.answer(r"Platform to set up", "telegram")
    await term.answer(r"Bot token from @BotFather", "123456:not-the-token")
    refusal = await term.expect(r"Try again")
    assert "credentials refused: telegram" in refusal
    assert "the token was refused" in refusal, refusal  # Telegram's answer, in Herald's words
    await term.expect(r"Bot token from @BotFather")
    await term.interrupt()
    await term.expect(r"nothing was written")
    assert await term.exit_code() == 130
    assert listing(tmp_path) == []


async def test_an_existing_file_is_edited_keeping_its_comments_and_other_keys(
    tmp_path: Path, tg: FakeTelegramServer, llm: FakeLLM
) -> None:
    config = tmp_path / "herald.yaml"
    config.write_text(EXISTING, encoding="utf-8")
    config.chmod(0o640)
    term = Terminal(tmp_path, "--base-url", tg.base_url)
    await full_interview(term, llm)
    assert await term.exit_code() == 0, "".join(term.seen)
    text = read(config)
    assert text.startswith(EXISTING.rstrip("\n"))
    assert "# I like steering" in text
    assert "log_level: DEBUG  # chatty for now" in text
    assert mode(config) == 0o640
    loaded = load_config(config)
    assert loaded.sessions.queue_cap == 7
    assert ("telegram", "default") in loaded.platforms.accounts()

    # Re-run to change one part: the rest (comments, token, model) stays.
    changed = await script(tmp_path, "--home", "telegram:999")
    assert changed.exit_code == 0, changed.output
    after = read(config)
    assert after == text.replace("home: telegram:111", "home: telegram:999")


async def test_ctrl_c_leaves_the_previous_file_untouched(
    tmp_path: Path, tg: FakeTelegramServer, llm: FakeLLM
) -> None:
    config = tmp_path / "herald.yaml"
    config.write_text(EXISTING, encoding="utf-8")
    before = config.read_bytes()
    term = Terminal(tmp_path, "--base-url", tg.base_url)
    await term.answer(r"Platform to set up", "telegram")
    await term.answer(r"Bot token from @BotFather", TOKEN)
    await term.answer(r"Who may talk to the agent", "111")
    await term.answer(r"pairing code", "n")
    await term.expect(r"Home channel")
    await term.interrupt()
    await term.expect(r"nothing was written")
    assert await term.exit_code() == 130
    assert config.read_bytes() == before
    assert listing(tmp_path) == ["herald.yaml"]


async def script(tmp_path: Path, *args: str) -> Result:
    """`herald setup --non-interactive <args>` in-process (in a worker thread: the checks
    run their own event loop)."""
    config = str(tmp_path / "herald.yaml")
    async with asyncio.timeout(WAIT):
        return await asyncio.to_thread(
            CliRunner().invoke,
            app,
            ["setup", "--non-interactive", "--config", config, *args],
            env={"COLUMNS": "250", "NO_COLOR": "1"},
        )


async def test_non_interactive_flags_answer_everything(
    tmp_path: Path, tg: FakeTelegramServer
) -> None:
    args = ("--platform", "telegram", "--base-url", tg.base_url, "--allowed-users", "42")
    refused = await script(tmp_path, *args, "--token", "1:wrong")
    assert refused.exit_code == 1
    assert "credentials refused: telegram" in refused.stderr
    assert "nothing was written" in refused.stderr
    assert listing(tmp_path) == []

    missing = await script(tmp_path, *args)
    assert missing.exit_code == 2
    assert "telegram needs 'Bot token from @BotFather" in missing.stderr
    assert "give --token" in missing.stderr

    done = await script(tmp_path, *args, "--token", TOKEN, "--no-pairing", "--home", "telegram:42")
    assert done.exit_code == 0, done.stderr
    assert "@herald_setup_bot" in done.stdout
    loaded = load_config(tmp_path / "herald.yaml")
    section = loaded.platforms.accounts()[("telegram", "default")]
    assert section.allowed_users == ("42",)
    assert section.pairing is False


async def test_a_home_on_a_platform_not_configured_is_refused(tmp_path: Path) -> None:
    """Reports to it would never arrive: refused, as `jobs add --target` refuses it."""
    refused = await script(tmp_path, "--home", "telegram:42")

    assert refused.exit_code == 2
    assert "home 'telegram:42': platform telegram is not configured" in refused.stderr
    assert listing(tmp_path) == []


async def test_discord_is_checked_through_users_me(tmp_path: Path) -> None:
    async with FakeDiscordServer(token="discord-token") as discord:
        args = ("--platform", "discord", "--base-url", discord.api_base, "--allowed-users", "7")
        bad = await script(tmp_path, *args, "--token", "wrong")
        assert bad.exit_code == 1
        assert "credentials refused: discord" in bad.stderr
        good = await script(tmp_path, *args, "--token", "discord-token")
    assert good.exit_code == 0, good.stderr
    data = yaml.safe_load(read(tmp_path / "herald.yaml"))
    assert read(data["platforms"]["discord"]["token_file"]) == "discord-token\n"
    assert "discord:" in good.stdout


async def test_slack_is_checked_through_auth_test(tmp_path: Path) -> None:
    async with FakeSlackServer(DEFAULT_BOT_TOKEN, DEFAULT_APP_TOKEN) as slack:
        args = ("--platform", "slack", "--base-url", slack.base_url, "--allowed-users", "U1")
        bad = await script(
            tmp_path, *args, "--bot-token", "xoxb-wrong", "--app-token", DEFAULT_APP_TOKEN
        )
        assert bad.exit_code == 1
        assert "credentials refused: slack" in bad.stderr
        assert listing(tmp_path) == []
        good = await script(
            tmp_path, *args, "--bot-token", DEFAULT_BOT_TOKEN, "--app-token", DEFAULT_APP_TOKEN
        )
    assert good.exit_code == 0, good.output
    loaded = load_config(tmp_path / "herald.yaml")
    assert ("slack", "default") in loaded.platforms.accounts()


async def test_twilio_is_checked_by_fetching_the_account(tmp_path: Path) -> None:
    async with FakeTwilioServer() as twilio:
        args = (
            "--platform",
            "twilio",
            "--base-url",
            twilio.base_url,
            "--account-sid",
            twilio.account_sid,
            "--from-number",
            "+15551230000",
            "--public-url",
            "https://herald.example.com",
            "--allowed-users",
            "+15559870000",
        )
        bad = await script(tmp_path, *args, "--auth-token", "f" * 32)
        assert bad.exit_code == 1
        assert "credentials refused: twilio" in bad.stderr
        good = await script(tmp_path, *args, "--auth-token", twilio.auth_token)
    assert good.exit_code == 0, good.output
    assert twilio.account_sid in good.stdout
    data = yaml.safe_load(read(tmp_path / "herald.yaml"))
    assert data["platforms"]["twilio"]["from_number"] == "+15551230000"
    assert read(data["platforms"]["twilio"]["auth_token_file"]) == twilio.auth_token + "\n"


async def test_the_model_endpoint_is_checked_and_an_unreachable_one_not_saved(
    tmp_path: Path, llm: FakeLLM
) -> None:
    first = await script(
        tmp_path, "--llm-base-url", llm.base_url, "--llm-api-key", "k", "--model", "fake-model"
    )
    assert first.exit_code == 0, first.output
    assert "'fake-model' listed" in first.stdout
    assert llm.model_listings == 1
    unreachable = await script(
        tmp_path, "--llm-base-url", "http://127.0.0.1:9/v1", "--llm-api-key", "k2"
    )
    assert unreachable.exit_code == 1
    assert "llm:" in unreachable.stderr
    data = yaml.safe_load(read(tmp_path / "herald.yaml"))
    assert data["llm"]["base_url"] == llm.base_url
    assert read(data["llm"]["api_key_file"]) == "k\n"  # the first run's, untouched


async def test_without_a_terminal_or_flags_it_stops_and_writes_nothing(tmp_path: Path) -> None:
    config = str(tmp_path / "herald.yaml")
    async with asyncio.timeout(WAIT):
        result = await asyncio.to_thread(
            CliRunner().invoke, app, ["setup", "--config", config], input=""
        )
    assert result.exit_code == 2
    assert "--non-interactive" in result.stderr
    assert listing(tmp_path) == []


async def test_email_is_checked_by_logging_in_to_imap_and_smtp(tmp_path: Path) -> None:
    async with Dovecot() as dovecot, SmtpServer() as smtp:
        args = (
            "--platform",
            "email",
            "--address",
            DOVECOT_USER,
            "--username",
            DOVECOT_USER,
            "--imap-host",
            "127.0.0.1",
            "--imap-port",
            str(dovecot.port),
            "--smtp-host",
            "127.0.0.1",
            "--smtp-port",
            str(smtp.port),
            "--set",
            "imap_security=none",
            "--set",
            f"smtp_security={smtp.section()['smtp_security']}",
            "--allowed-users",
            "ann@example.org",
        )
        bad = await script(tmp_path, *args, "--password", "wrong")
        assert bad.exit_code == 1
        assert "credentials refused: email: IMAP login refused" in bad.stderr
        assert listing(tmp_path) == []
        good = await script(tmp_path, *args, "--password", DOVECOT_PASSWORD)
    assert good.exit_code == 0, good.output
    assert "SMTP 127.0.0.1" in good.stdout
    loaded = load_config(tmp_path / "herald.yaml")
    section = loaded.platforms.accounts()[("email", "default")]
    assert section.allowed_users == ("ann@example.org",)


async def test_matrix_is_checked_through_whoami(tmp_path: Path) -> None:
    """A real Synapse: the access token is checked with `whoami` (the flags come from the
    Matrix spec's questions)."""
    synapse = await shared_synapse()
    bot = await synapse.register("setup")
    args = (
        "--platform",
        "matrix",
        "--homeserver",
        synapse.url,
        "--user-id",
        bot.user_id,
        "--allowed-users",
        "@ann:herald.test",
    )
    bad = await script(tmp_path, *args, "--access-token", "syt_refused_0000000000")
    assert bad.exit_code == 1
    assert "credentials refused: matrix" in bad.stderr
    assert listing(tmp_path) == []
    good = await script(tmp_path, *args, "--access-token", bot.access_token)
    assert good.exit_code == 0, good.output
    assert f"matrix: {bot.user_id}" in good.stdout
    data = yaml.safe_load(read(tmp_path / "herald.yaml"))
    assert read(data["platforms"]["matrix"]["access_token_file"]) == f"{bot.access_token}\n"
    assert data["platforms"]["matrix"]["allowed_users"] == ["@ann:herald.test"]


async def test_mattermost_is_checked_through_users_me(tmp_path: Path) -> None:
    """The fake Mattermost: the bot's token is checked with `GET /users/me` (the flags come
    from the Mattermost spec's questions)."""
    async with FakeMattermostServer() as mm:
        args = (
            "--platform",
            "mattermost",
            "--url",
            mm.base_url,
            "--allowed-users",
            "annannannannannannannanna1",
        )
        bad = await script(tmp_path, *args, "--token", "refusedrefusedrefusedrefus")
        assert bad.exit_code == 1
        assert "credentials refused: mattermost" in bad.stderr
        assert listing(tmp_path) == []
        good = await script(tmp_path, *args, "--token", MATTERMOST_TOKEN)
    assert good.exit_code == 0, good.output
    assert f"mattermost: @{BOT_NAME} ({BOT_ID})" in good.stdout
    data = yaml.safe_load(read(tmp_path / "herald.yaml"))
    assert read(data["platforms"]["mattermost"]["token_file"]) == f"{MATTERMOST_TOKEN}\n"
    assert data["platforms"]["mattermost"]["allowed_users"] == ["annannannannannannannanna1"]


async def test_signal_is_checked_against_the_daemon(tmp_path: Path) -> None:
    """The fake signal-cli daemon: a number it does not serve is refused (nothing written),
    the registered one is described and kept, its people read as E.164."""
    async with FakeSignalCli(multi_account=True) as signal:
        args = ("--platform", "signal", "--url", signal.url, "--allowed-users", "+1 555 123 0001")
        bad = await script(
            tmp_path, *args, "--number", "+15550000001", "--set", "multi_account=true"
        )
        assert bad.exit_code == 1
        assert "credentials refused: signal" in bad.stderr
        assert listing(tmp_path) == []
        good = await script(
            tmp_path, *args, "--number", signal.number, "--set", "multi_account=true"
        )
        assert good.exit_code == 0, good.output
        assert f"signal: {signal.number} on signal-cli" in good.stdout
    section = load_config(tmp_path / "herald.yaml").platforms.accounts()[("signal", "default")]
    assert section.allowed_users == ("+15551230001",)


async def test_a_second_account_moves_the_first_under_accounts(
    tmp_path: Path, tg: FakeTelegramServer
) -> None:
    work_token = "654321:setup-work-token-abcdefghijklmnopqrstuvwxyz"
    first = await script(
        tmp_path, "--platform", "telegram", "--base-url", tg.base_url, "--token", TOKEN
    )
    assert first.exit_code == 0, first.stderr
    async with FakeTelegramServer(work_token, bot_username="work_bot") as work:
        args = ("--platform", "telegram", "--base-url", work.base_url, "--token", work_token)
        second = await script(tmp_path, *args, "--account", "work", "--allowed-users", "7")
        assert second.exit_code == 0, second.stderr
        assert "@work_bot" in second.stdout
        unnamed = await script(tmp_path, *args)
    assert unnamed.exit_code == 2
    assert "has accounts (default, work): name the one to set up with --account" in (unnamed.stderr)
    written = yaml.safe_load(read(tmp_path / "herald.yaml"))
    assert list(written["platforms"]["telegram"]) == ["accounts"]
    assert list(written["platforms"]["telegram"]["accounts"]) == ["default", "work"]
    loaded = load_config(tmp_path / "herald.yaml")
    accounts = loaded.platforms.accounts()
    assert list(accounts) == [("telegram", "default"), ("telegram", "work")]
    assert accounts[("telegram", "work")].allowed_users == ("7",)
    assert [s.identity for s in accounts.values()] == [("token", TOKEN), ("token", work_token)]


async def test_an_account_name_that_is_a_path_is_refused_before_anything_is_written(
    tmp_path: Path, tg: FakeTelegramServer
) -> None:
    """The account names the secret file (`secrets/telegram.accounts.<account>.token`): a
    name with `/` or `..` would write it outside the secrets directory."""
    first = await script(
        tmp_path, "--platform", "telegram", "--base-url", tg.base_url, "--token", TOKEN
    )
    assert first.exit_code == 0, first.stderr
    before = read(tmp_path / "herald.yaml")
    args = ("--platform", "telegram", "--base-url", tg.base_url, "--token", "9:other")
    bad = await script(tmp_path, *args, "--account", "../../escape")
    assert bad.exit_code == 2, bad.output
    assert "is not an account name" in bad.stderr
    assert read(tmp_path / "herald.yaml") == before
    assert not (tmp_path / "escape.token").exists()
