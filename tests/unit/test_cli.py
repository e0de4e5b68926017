"""The `herald` command line, run through Typer's test runner against temporary state.

Every command that touches the database runs its own event loop with `asyncio.run`, so the
runner is always invoked in a worker thread (`asyncio.to_thread`): the test's own loop stays
free, and can serve the fake LLM meanwhile.
"""

from __future__ import annotations

import json
import re
import socket
from typing import Any

import pytest
import yaml
from typer.testing import Result

from gateway.contracts.history import ChatMessage, Role, TurnResult
from gateway.contracts.ids import SessionKey
from gateway.store import Store
from gateway.store import engine as engine_mod
from tests.fakes.llm import FakeLLM
from tests.fakes.speech import FakeSpeech
from tests.turns import finish_turn, start_turn
from tests.unit.cli_harness import Herald

pytestmark = pytest.mark.usefixtures("clean_environment")

VERDICT = re.compile(r"^(OK|WARN|FAIL)\s+([\w.]+): (.*)$")

ALICE = SessionKey("telegram:bot:alice")
BOB = SessionKey("api:default:bob")


async def no_snapshot(*_: object) -> tuple[str, str]:
    return "", ""


async def add_exchange(
    store: Store, key: SessionKey, *messages: ChatMessage, status: str = "completed"
) -> None:
    """One turn of `key`: the first message starts it, the others finish it."""
    session = await store.open_session(key, platform="test", user_id=None, snapshot=no_snapshot)
    turn_id, _ = await start_turn(store, session.id, messages[0])
    await finish_turn(store, session.id, turn_id, TurnResult(status=status, messages=messages[1:]))


@pytest.fixture
async def populated(herald: Herald) -> Herald:
    """Two sessions: Alice's with an interrupted turn, and Bob's."""
    async with Store.open(herald.database_url) as store:
        await add_exchange(
            store,
            ALICE,
            ChatMessage(Role.USER, "hello there from alice"),
            ChatMessage(Role.ASSISTANT, "hi alice, how can I help?"),
        )
        await add_exchange(
            store,
            ALICE,
            ChatMessage(Role.USER, "tell me a long story"),
            ChatMessage(Role.ASSISTANT, "Once upon a", interrupted=True),
            status="interrupted",
        )
        await add_exchange(
            store,
            BOB,
            ChatMessage(Role.USER, "what is the weather in Lisbon"),
            ChatMessage(Role.ASSISTANT, "sunny and warm"),
        )
    return herald


def closed_port() -> int:
    """A local TCP port nothing listens on: bound, then closed."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


def verdicts(result: Result) -> dict[str, tuple[str, str]]:
    """`herald doctor`'s verdict lines: check name → (verdict, detail)."""
    found: dict[str, tuple[str, str]] = {}
    for line in result.stdout.splitlines():
        match = VERDICT.match(line)
        if match:
            found[match[2]] = (match[1], match[3])
    return found


CHECKS = ["config", "state_dir", "database", "llm", "platforms", "skills"]


# config check ------------------------------------------------------------------------------------


async def test_config_check_prints_the_config_with_secrets_masked(herald: Herald) -> None:
    herald.configure(
        database_url="postgresql+asyncpg://herald:db-pass-123@db.internal/herald",
        llm={"api_key": "sk-live-456", "model": "big-model"},
        api={"key": "api-key-789", "port": 9001},
    )

    result = await herald.invoke("config", "check")

    assert result.exit_code == 0, result.output
    printed = yaml.safe_load(result.stdout)
    assert printed["llm"]["api_key"] == "***"
    assert printed["api"]["key"] == "***"
    assert printed["database_url"] == "postgresql+asyncpg://herald:***@db.internal/herald"
    assert printed["llm"]["model"] == "big-model"
    assert printed["llm"]["provider"] == "openai"
    assert printed["api"]["port"] == 9001
    assert printed["state_dir"] == str(herald.state_dir)
    for secret in ("db-pass-123", "sk-live-456", "api-key-789"):
        assert secret not in result.output


@pytest.mark.parametrize(
    ("sections", "key"),
    [
        pytest.param({"api": {"port": 70000}}, "api.port", id="range"),
        pytest.param({"llm": {"modle": "gpt-4o"}}, "llm.modle", id="unknown-key"),
        pytest.param({"llm": {"compression_threshold": 2}}, "llm.compression_threshold", id="gt"),
        pytest.param({"api": {"host": "0.0.0.0"}}, "api.key", id="no-key-off-loopback"),  # noqa: S104
        pytest.param(
            {"llm": {"base_url": "127.0.0.1:18101/v1"}}, "llm.base_url", id="url-without-scheme"
        ),
        pytest.param(
            {"llm": {"transcription": {"base_url": "localhost:9000/v1"}}},
            "llm.transcription.base_url",
            id="transcription-url",
        ),
        pytest.param(
            {"memory": {"provider": "mem0", "mem0": {"base_url": "mem0.internal", "api_key": "k"}}},
            "memory.mem0.base_url",
            id="memory-url",
        ),
    ],
)
async def test_a_bad_config_exits_2_naming_the_key_on_stderr(
    herald: Herald, sections: dict[str, Any], key: str
) -> None:
    herald.configure(**sections)

    result = await herald.invoke("config", "check")

    assert result.exit_code == 2
    assert "invalid configuration" in result.stderr
    assert key in result.stderr
    assert result.stdout == ""


async def test_a_missing_config_file_exits_2(herald: Herald) -> None:
    herald.path.unlink()

    result = await herald.invoke("config", "check")

    assert result.exit_code == 2
    assert "cannot read config file" in result.stderr


async def test_a_config_error_is_printed_verbatim(herald: Herald) -> None:
    herald.configure(home={"targets": ["[bold]x"]})

    result = await herald.invoke("config", "check")

    assert result.exit_code == 2
    assert "'[bold]x' is not of the form" in result.stderr


# db upgrade --------------------------------------------------------------------------------------


async def test_db_upgrade_creates_the_schema_and_prints_the_revision(herald: Herald) -> None:
    head = engine_mod.head_revision()

    result = await herald.invoke("db", "upgrade")

    assert result.exit_code == 0, result.output
    assert result.stdout == f"database at revision {head}\n"
    assert (herald.state_dir / "herald.db").is_file()
    async with Store.open(herald.database_url, migrate=False) as store:
        assert await engine_mod.current_revision(store.engine) == head


async def test_db_upgrade_twice_is_harmless(herald: Herald) -> None:
    first = await herald.invoke("db", "upgrade")
    second = await herald.invoke("db", "upgrade")

    assert first.exit_code == second.exit_code == 0
    assert first.stdout == second.stdout


# sessions ----------------------------------------------------------------------------------------


async def test_sessions_list_shows_every_session(populated: Herald) -> None:
    result = await populated.invoke("sessions", "list")

    assert result.exit_code == 0, result.output
    rows = {
        cells[0]: cells
        for line in result.stdout.splitlines()
        if len(cells := re.split(r"\s{2,}", line.strip())) >= 4
    }
    assert rows[ALICE][1:3] == ["#1", "4"]
    assert rows[BOB][1:3] == ["#1", "2"]
    assert list(rows) == ["key", BOB, ALICE]  # most recently active first


async def test_sessions_list_names_each_sessions_profile(herald: Herald) -> None:
    async def nothing(*_: object) -> tuple[str, str]:
        return "", ""

    async with Store.open(herald.database_url) as store:
        await store.open_session(
            SessionKey("test:acct:w"),
            platform="test",
            user_id=None,
            snapshot=nothing,
            profile="work",
        )
    listed = await herald.invoke("sessions", "list")
    assert listed.exit_code == 0, listed.output
    [row] = [line.split() for line in listed.stdout.splitlines() if "test:acct:w" in line]
    assert "work" in row
    as_json = await herald.invoke("sessions", "list", "--json")
    assert json.loads(as_json.stdout)[0]["profile"] == "work"


async def test_sessions_show_prints_the_transcript_with_the_interrupted_mark(
    populated: Herald,
) -> None:
    result = await populated.invoke("sessions", "show", ALICE)

    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[0] == f"{ALICE} conversation #1, 4 messages"
    assert [line.split(" ", 2)[2] for line in lines[1:]] == [
        "user: hello there from alice",
        "assistant: hi alice, how can I help?",
        "user: tell me a long story",
        "assistant (interrupted): Once upon a",
    ]


async def test_sessions_show_of_an_unknown_key_exits_1(populated: Herald) -> None:
    result = await populated.invoke("sessions", "show", "telegram:bot:nobody")

    assert result.exit_code == 1
    assert "no session telegram:bot:nobody" in result.output


async def test_sessions_search_finds_a_message(populated: Herald) -> None:
    result = await populated.invoke("sessions", "search", "Lisbon")

    assert result.exit_code == 0, result.output
    (line,) = result.stdout.splitlines()
    assert line.startswith(f"{BOB} ")
    assert line.endswith("user: what is the weather in «Lisbon»")


async def test_sessions_search_without_a_match_says_so(populated: Herald) -> None:
    result = await populated.invoke("sessions", "search", "zanzibar")

    assert result.exit_code == 0, result.output
    assert result.stdout == "no matches\n"


async def test_a_session_key_that_looks_like_markup_is_printed_verbatim(herald: Herald) -> None:
    key = SessionKey("api:default:[/]odd")
    async with Store.open(herald.database_url) as store:
        await add_exchange(
            store, key, ChatMessage(Role.USER, "hi"), ChatMessage(Role.ASSISTANT, "hello")
        )

    listed = await herald.invoke("sessions", "list")
    shown = await herald.invoke("sessions", "show", key)

    assert listed.exit_code == 0
    assert key in listed.stdout
    assert shown.exit_code == 0
    assert shown.stdout.startswith(f"{key} conversation #1")


# doctor ------------------------------------------------------------------------------------------


async def test_doctor_with_the_echo_provider_warns_and_exits_0(herald: Herald) -> None:
    result = await herald.invoke("doctor")

    assert result.exit_code == 0, result.output
    found = verdicts(result)
    assert list(found) == CHECKS
    assert found["config"][0] == "OK"
    assert found["state_dir"] == (
        "WARN",
        f"none yet at {herald.state_dir}: `herald run` creates it",
    )
    assert found["database"][0] == "WARN"  # not migrated yet
    assert "herald db upgrade" in found["database"][1]
    assert found["llm"] == ("WARN", "offline echo provider (no LLM configured)")
    assert found["platforms"][0] == "OK"


async def test_doctor_creates_nothing(herald: Herald) -> None:
    """A read-only command: a missing state directory is reported, not made."""
    result = await herald.invoke("doctor")

    assert result.exit_code == 0, result.output
    assert not herald.state_dir.exists()


async def test_doctor_fails_a_home_on_a_platform_not_configured(herald: Herald) -> None:
    herald.configure(home="telegram:42")

    result = await herald.invoke("doctor")

    assert result.exit_code == 1, result.output
    verdict, detail = verdicts(result)["home"]
    assert verdict == "FAIL"
    assert "platform telegram is not configured" in detail


async def test_doctor_after_db_upgrade_finds_the_database_ok(herald: Herald) -> None:
    assert (await herald.invoke("db", "upgrade")).exit_code == 0

    result = await herald.invoke("doctor")

    assert result.exit_code == 0, result.output
    assert verdicts(result)["state_dir"] == ("OK", str(herald.state_dir))
    verdict, detail = verdicts(result)["database"]
    assert verdict == "OK"
    assert detail == f"sqlite, schema {engine_mod.head_revision()}"


async def test_doctor_fails_when_the_llm_is_unreachable(herald: Herald) -> None:
    herald.configure(
        llm={
            "base_url": f"http://127.0.0.1:{closed_port()}/v1",
            "max_retries": 0,
            "connect_timeout": 0.5,
        }
    )

    result = await herald.invoke("doctor")

    assert result.exit_code == 1, result.output
    found = verdicts(result)
    assert list(found) == CHECKS
    verdict, detail = found["llm"]
    assert verdict == "FAIL"
    assert "cannot reach the model endpoint" in detail
    assert found["config"][0] == "OK"
    assert found["state_dir"][0] == "WARN"  # not made by a read-only command


async def test_doctor_fails_when_the_state_dir_is_not_writable(herald: Herald) -> None:
    blocker = herald.state_dir.parent / "a-file"
    blocker.write_text("not a directory")
    herald = Herald(herald.path, blocker / "state").configure()

    result = await herald.invoke("doctor")

    assert result.exit_code == 1, result.output
    found = verdicts(result)
    assert found["state_dir"][0] == "FAIL"
    assert found["database"][0] == "FAIL"


async def test_doctor_with_a_reachable_llm_is_ok(herald: Herald) -> None:
    async with FakeLLM() as llm:
        base_url = llm.base_url
        herald.configure(llm={"base_url": base_url, "model": llm.model, "max_retries": 0})

        result = await herald.invoke("doctor")

    assert result.exit_code == 0, result.output
    verdict, detail = verdicts(result)["llm"]
    assert verdict == "OK"
    assert detail == f"{base_url}/ reachable: 1 models, 'fake-model' listed"
    assert llm.model_listings == 1


async def test_doctor_warns_when_the_model_is_not_listed(herald: Herald) -> None:
    async with FakeLLM() as llm:
        herald.configure(llm={"base_url": llm.base_url, "model": "fake", "max_retries": 0})

        result = await herald.invoke("doctor")

    assert result.exit_code == 0, result.output
    verdict, detail = verdicts(result)["llm"]
    assert verdict == "WARN"
    assert detail.endswith("'fake' not listed")


async def test_doctor_checks_each_profiles_own_model(herald: Herald) -> None:
    async with FakeLLM() as llm:
        herald.configure(
            llm={"base_url": llm.base_url, "model": llm.model, "max_retries": 0},
            profiles={
                "work": {
                    "llm": {
                        "base_url": f"http://127.0.0.1:{closed_port()}/v1",
                        "api_key": "work-secret-key",
                        "connect_timeout": 0.5,
                    }
                },
                "same": {"soul": "the default's model"},  # no model of its own: not checked
            },
        )

        result = await herald.invoke("doctor")

    assert result.exit_code == 1, result.output
    found = verdicts(result)
    assert found["llm"][0] == "OK"
    verdict, detail = found["profiles.work.llm"]
    assert verdict == "FAIL"
    assert "cannot reach the model endpoint" in detail
    assert "profiles.same.llm" not in found
    assert "work-secret-key" not in result.output
    assert llm.model_listings == 1


# chat --------------------------------------------------------------------------------------------


async def test_chat_when_the_daemon_is_not_running_exits_1(herald: Herald) -> None:
    herald.configure(api={"port": closed_port()})

    result = await herald.invoke("chat", "-m", "hello")

    assert result.exit_code == 1
    assert "not running" in result.output
    assert "herald run" in result.output


async def test_sessions_show_lists_each_inbound_message_with_its_outcome(herald: Herald) -> None:
    from gateway.store import inbox as inbox_sql
    from gateway.store.inbox import Outcome
    from tests.fakes.platform import inbound

    key = SessionKey("test:acct:c1")
    async with Store.open(herald.database_url) as store, store.write() as conn:
        first = await inbox_sql.insert(
            conn, inbound("what's up", message_id="a"), key=key, user_id=None
        )
        await inbox_sql.insert(
            conn,
            inbound("spam", message_id="b"),
            key=key,
            user_id=None,
            outcome=Outcome.REJECTED,
            detail="sender not allowed",
        )
        assert first is not None
        await inbox_sql.settle(conn, [first], Outcome.DROPPED, detail="cleared by /stop")

    result = await herald.invoke("sessions", "show", key)

    assert result.exit_code == 0, result.output
    assert "Inbound messages" in result.stdout
    lines = result.stdout.splitlines()
    assert any(
        "what's up" in line and "dropped" in line and "cleared by /stop" in line for line in lines
    )
    assert any("spam" in line and "rejected" in line for line in lines)


async def test_doctor_speaks_a_few_words_to_the_speech_endpoint(herald: Herald) -> None:
    async with FakeSpeech() as speech:
        herald.configure(speech={"base_url": speech.base_url, "api_key": "tts-key-123456"})
        result = await herald.invoke("doctor")
        verdict, detail = verdicts(result)["speech"]
        assert verdict == "OK"
        assert detail.startswith(f"{speech.base_url}: ")
        assert "bytes of Ogg/Opus (tts-1, alloy)" in detail
        assert speech.said == ["Herald is ready."]

        speech.status = 401
        result = await herald.invoke("doctor")
    assert result.exit_code == 1, result.output
    verdict, detail = verdicts(result)["speech"]
    assert verdict == "FAIL"
    assert "refused it (HTTP 401); answers will be text" in detail
