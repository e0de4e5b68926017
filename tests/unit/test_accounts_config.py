"""Several accounts of a platform in the config: the forms, the defaults they inherit, the
errors (naming the key), and targets that name an account."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from adapters.twilio.config import TwilioConfig
from gateway.access import Access
from gateway.config import load_config, masked
from gateway.contracts.errors import ConfigError
from gateway.cron.targets import (
    Address,
    TargetError,
    home_problems,
    normalize_targets,
    parse_target,
    resolve,
    session_chat,
)
from gateway.store.outbox import Target
from gateway.supervisor import adapter_name


def load(tmp_path: Path, data: dict[str, Any]) -> Any:
    path = tmp_path / "herald.yaml"
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    return load_config(path)


def refused(tmp_path: Path, data: dict[str, Any]) -> str:
    with pytest.raises(ConfigError) as caught:
        load(tmp_path, data)
    return str(caught.value)


TWO = {
    "telegram": {
        "allowed_users": [1],
        "busy_mode": "steer",
        "accounts": {
            "family": {"token": "1:family"},
            "work": {"token": "2:work", "allowed_users": [2]},
        },
    }
}


def test_accounts_as_a_mapping_inherit_the_platform_keys(tmp_path: Path) -> None:
    config = load(tmp_path, {"platforms": TWO})
    accounts = config.platforms.accounts()
    assert list(accounts) == [("telegram", "family"), ("telegram", "work")]
    family, work = accounts.values()
    assert (family.account, family.allowed_users, family.busy_mode) == ("family", ("1",), "steer")
    assert (work.account, work.allowed_users, work.busy_mode) == ("work", ("2",), "steer")
    shown = masked(config)["platforms"]["telegram"]
    assert shown["accounts"]["work"]["token"] == "***"


def test_accounts_as_a_list_name_themselves(tmp_path: Path) -> None:
    config = load(
        tmp_path,
        {
            "platforms": {
                "telegram": {
                    "accounts": [
                        {"account": "family", "token": "1:family"},
                        {"account": "work", "token": "2:work", "enabled": False},
                    ]
                }
            }
        },
    )
    assert list(config.platforms.accounts()) == [("telegram", "family")]  # work is off


def test_one_section_means_what_it_meant(tmp_path: Path) -> None:
    config = load(tmp_path, {"platforms": {"telegram": {"token": "1:a", "account": "bot"}}})
    assert list(config.platforms.accounts()) == [("telegram", "bot")]
    assert masked(config)["platforms"]["telegram"]["account"] == "bot"
    plain = load(tmp_path, {"platforms": {"telegram": {"token": "1:a"}}})
    assert list(plain.platforms.accounts()) == [("telegram", "default")]


@pytest.mark.parametrize(
    ("telegram", "error"),
    [
        (
            {"accounts": {"a": {"token": "1:x"}, "b": {"token": "1:x"}}},
            "platforms.telegram.accounts.b.token: the same as "
            "platforms.telegram.accounts.a.token (one bot twice)",
        ),
        (
            {"accounts": [{"account": "a", "token": "1:x"}, {"account": "a", "token": "2:x"}]},
            "platforms.telegram: accounts[1].account: two accounts are named 'a'",
        ),
        (
            {"accounts": [{"token": "1:x"}]},
            "accounts[0]: each account of the list needs `account: <name>`",
        ),
        (
            {"accounts": {"work": {"tokn": "1:x"}}},
            "platforms.telegram.accounts.work.tokn: unknown key; did you mean 'token'?",
        ),
        (
            {"accounts": {"work": {}}},
            "platforms.telegram.accounts.work.token: Field required",
        ),
        (
            {"accounts": {"w x": {"token": "1:x"}}},
            "platforms.telegram.accounts.w x.account: 'w x' cannot name an account",
        ),
        (
            {"accounts": {"a": {"token": "1:x", "account": "b"}}},
            "accounts.a.account: 'b' differs from its key 'a'",
        ),
        ({"accounts": {}}, "accounts: name at least one account"),
        ({"tokn": "1:x"}, "platforms.telegram.tokn: unknown key; did you mean 'token'?"),
    ],
)
def test_bad_accounts_are_refused_naming_the_key(
    tmp_path: Path, telegram: dict[str, Any], error: str
) -> None:
    assert error in refused(tmp_path, {"platforms": {"telegram": telegram}})


MAILBOX = {
    "imap_host": "imap.example.test",
    "smtp_host": "smtp.example.test",
    "username": "herald",
    "password": "pw",
}


@pytest.mark.parametrize(
    ("platform", "entry", "key"),
    [
        (
            "email",
            {
                **MAILBOX,
                "accounts": {
                    "a": {"address": "a@example.test"},
                    "b": {"address": "b@example.test"},
                },
            },
            "username",
        ),
        (
            "matrix",
            {
                "homeserver": "https://matrix.example.test",
                "user_id": "@herald:example.test",
                "accounts": {"a": {"access_token": "t1"}, "b": {"access_token": "t2"}},
            },
            "user_id",
        ),
    ],
)
def test_two_accounts_on_one_mailbox_or_user_are_refused(
    tmp_path: Path, platform: str, entry: dict[str, Any], key: str
) -> None:
    """Inherited login keys: two receivers of one mailbox (or one Matrix user) would take
    every message twice and answer it twice."""
    error = refused(tmp_path, {"platforms": {platform: entry}})
    assert f"platforms.{platform}.accounts.b.{key}: the same as " in error
    assert "(one bot twice)" in error


def test_one_mailbox_may_serve_two_accounts_through_two_folders(tmp_path: Path) -> None:
    entry = {
        **MAILBOX,
        "address": "h@example.test",
        "accounts": {"a": {"folder": "INBOX"}, "b": {"folder": "Work"}},
    }
    config = load(tmp_path, {"platforms": {"email": entry}})
    assert list(config.platforms.accounts()) == [("email", "a"), ("email", "b")]


@pytest.mark.parametrize("name", ["a/b", "..", ".", "a\\b", "a?b", "a#b", "a%2Fb"])
def test_account_names_that_are_not_one_path_segment_are_refused(tmp_path: Path, name: str) -> None:
    """The name is a directory (`files/<platform>/<account>/`) and a webhook path segment
    (`/webhooks/<platform>:<account>`): `..` or `/` would leave the files directory or
    send another account's webhooks there."""
    error = refused(
        tmp_path,
        {"platforms": {"telegram": {"accounts": {name: {"token": "1:x"}, "b": {"token": "2:y"}}}}},
    )
    assert f"accounts.{name}.account" in error


def test_a_trigger_target_must_name_the_account_when_it_cannot_be_told(tmp_path: Path) -> None:
    trigger = {"scheme": "github", "secret": "s" * 32, "prompt": "p", "owner": "cli"}
    bad = {"platforms": TWO, "triggers": {"t": {**trigger, "targets": ["telegram:5"]}}}
    assert "telegram has several accounts (family, work): name one" in refused(tmp_path, bad)
    unknown = {"platforms": TWO, "triggers": {"t": {**trigger, "targets": ["telegram:home:5"]}}}
    assert "name one" in refused(tmp_path, unknown)  # `home` is no account: chat 'home'
    good = {"platforms": TWO, "triggers": {"t": {**trigger, "targets": ["telegram:work:5"]}}}
    assert load(tmp_path, good).triggers["t"].targets == ("telegram:work:5",)


CONFIGURED = {("telegram", "family"), ("telegram", "work"), ("matrix", "default")}


def test_the_part_after_the_platform_is_an_account_only_when_configured() -> None:
    assert parse_target("telegram:work:5", CONFIGURED) == Address("telegram", "5", None, "work")
    assert parse_target("telegram:work:5:9", CONFIGURED) == Address("telegram", "5", "9", "work")
    assert parse_target("telegram:5:9", CONFIGURED) == Address("telegram", "5", "9")
    room = parse_target("matrix:!abc:example.org", CONFIGURED)
    assert room == Address("matrix", "!abc:example.org")
    assert parse_target("telegram:work:5") == Address("telegram", "work", "5")  # no accounts


def test_targets_are_stored_with_their_account() -> None:
    assert normalize_targets(["telegram:work:5", "home"], CONFIGURED) == (
        "telegram:work:5",
        "home",
    )
    with pytest.raises(TargetError, match=r"several accounts \(family, work\): name one"):
        normalize_targets(["telegram:5"], CONFIGURED)
    one = {("telegram", "bot")}
    assert normalize_targets(["telegram:5"], one) == ("telegram:5",)  # its only account
    both = {("telegram", "default"), ("telegram", "work")}
    assert normalize_targets(["telegram:5"], both) == ("telegram:5",)  # `default`


def test_resolve_goes_through_the_named_or_the_only_account() -> None:
    sections: Any = dict.fromkeys({("telegram", "family"), ("telegram", "work"), ("slack", "x")})
    resolved = resolve(
        ["telegram:work:5", "telegram:6", "slack:C1", "home"],
        homes=["telegram:family:7"],
        sethome=None,
        sections=sections,
    )
    assert resolved.targets == (
        Target("telegram", "work", "5"),  # type: ignore[arg-type]
        Target("slack", "x", "C1"),  # type: ignore[arg-type]
        Target("telegram", "family", "7"),  # type: ignore[arg-type]
    )
    assert resolved.problems == (
        "telegram:6: telegram has several accounts (family, work): name one, like "
        "telegram:family:<chat>",
    )


def test_homes_must_name_an_account_that_can_be_told() -> None:
    assert home_problems(["telegram:family:1"], CONFIGURED) == []
    [problem] = home_problems(["telegram:1"], CONFIGURED)
    assert "name one" in problem


def test_a_sessions_chat_names_its_account_only_when_needed() -> None:
    assert session_chat("telegram:work:5", CONFIGURED) == "telegram:work:5"
    assert session_chat("telegram:default:5", {("telegram", "default")}) == "telegram:5"
    assert session_chat("telegram:bot:5", {("telegram", "bot")}) == "telegram:5"
    assert session_chat("telegram:bot:5") == "telegram:5"  # accounts not known: as before


def test_operators_are_of_every_account_unless_one_is_named(tmp_path: Path) -> None:
    config = load(
        tmp_path, {"platforms": TWO, "access": {"operators": ["telegram:42", "telegram:work:7"]}}
    )
    access = Access(None, config.platforms.accounts(), config.access)  # type: ignore[arg-type]
    assert access.is_operator("telegram", "42", "family")
    assert access.is_operator("telegram", "42", "work")
    assert access.is_operator("telegram", "42")  # an identity, account unknown
    assert access.is_operator("telegram", "7", "work")
    assert not access.is_operator("telegram", "7", "family")
    assert not access.is_operator("telegram", "7")


def test_adapters_are_named_by_platform_alone_while_it_has_one_account() -> None:
    one: Any = {("telegram", "bot"): None, ("slack", "default"): None}
    two: Any = {("telegram", "family"): None, ("telegram", "work"): None}
    assert adapter_name("telegram", "bot", one) == "telegram"
    assert adapter_name("telegram", "work", two) == "telegram:work"


def test_twilio_signs_the_webhook_url_of_its_account() -> None:
    shop = TwilioConfig(
        account_sid="AC" + "0" * 32,
        auth_token="t",
        from_number="+15550000000",
        public_url="https://herald.example.com",
    )
    assert shop.webhook_url("sms") == "https://herald.example.com/webhooks/twilio/sms"
    assert (
        shop.webhook_url("sms", "twilio:shop")
        == "https://herald.example.com/webhooks/twilio:shop/sms"
    )


def test_turning_one_account_off_renames_no_other(tmp_path: Path) -> None:
    """A webhook receiver's URL is `/webhooks/<adapter name>` (Twilio's console points at it
    by hand): turning the work account off must not move the family account's from
    `twilio:family` to `twilio` (Twilio would post to a 404 and the texts would be lost)."""
    accounts = {"family": {"token": "1:family"}, "work": {"token": "2:work", "enabled": False}}
    config = load(tmp_path, {"platforms": {"telegram": {"accounts": accounts}}})
    assert list(config.platforms.accounts()) == [("telegram", "family")]
    every = config.platforms.every_account()
    assert list(every) == [("telegram", "family"), ("telegram", "work")]
    assert adapter_name("telegram", "family", every) == "telegram:family"
