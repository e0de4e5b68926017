"""Profiles and bindings in the config: parsing, defaults, errors, and which binding wins."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gateway.config import HeraldConfig, load_config, masked
from gateway.contracts.errors import ConfigError
from gateway.profiles import Binding, choose, parse_model
from gateway.redact import Redactor


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """No `HERALD_*` variable of the machine running the tests."""
    for name in list(os.environ):
        if name.upper().startswith("HERALD_"):
            monkeypatch.delenv(name)


def load(tmp_path: Path, text: str) -> HeraldConfig:
    path = tmp_path / "herald.yaml"
    path.write_text(f"state_dir: {tmp_path / 'state'}\n{text}", encoding="utf-8")
    return load_config(path)


def error(tmp_path: Path, text: str) -> str:
    with pytest.raises(ConfigError) as caught:
        load(tmp_path, text)
    return str(caught.value)


def test_a_config_without_profiles_has_the_default_profile_alone(tmp_path: Path) -> None:
    cfg = load(tmp_path, "llm: {model: m1}\nhome: test:1\n")
    assert cfg.profile_names() == ["default"]
    assert cfg.profile_llm("default") is cfg.llm
    assert cfg.profile_home("default") == ("test:1",)
    assert cfg.binding_rules() == []
    assert choose(cfg.binding_rules(), "telegram", "default", "5", None) == "default"


def test_a_profile_merges_its_llm_keys_over_the_top_level(tmp_path: Path) -> None:
    soul = tmp_path / "work-soul.md"
    soul.write_text("You are Ledger.\n", encoding="utf-8")
    cfg = load(
        tmp_path,
        f"""
llm: {{base_url: "http://127.0.0.1:9/v1", api_key: k, model: m1, temperature: 0.2}}
profiles:
  work:
    soul_file: {soul}
    llm: {{model: m2}}
    tools: [memory, session_search]
    home: [test:work]
  family:
    soul: You are Hearth.
    memory: {{namespace: default}}
""",
    )
    assert cfg.profile_names() == ["default", "work", "family"]
    work = cfg.profile_llm("work")
    assert (work.model, work.base_url, work.temperature) == ("m2", "http://127.0.0.1:9/v1", 0.2)
    assert work.api_key is not None
    assert work.api_key.get_secret_value() == "k"
    assert cfg.profile_llm("family") is cfg.llm
    assert cfg.profiles["work"].soul == "You are Ledger."
    assert cfg.profiles["work"].tools == ("memory", "session_search")
    assert cfg.profiles["family"].tools == "all"
    assert cfg.profiles["family"].namespace == "default"
    assert cfg.profiles["work"].namespace is None  # the profile's own name
    assert cfg.profile_home("work") == ("test:work",)
    assert cfg.profile_home("family") == ()  # the top-level home is the default's alone


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("profiles: {default: {soul: x}}", "profiles.default: the default profile is the top"),
        ("profiles: {Work: {soul: x}}", "profiles: 'Work': use lower-case letters"),
        ("profiles: {w: {llm: {model: 5, context_window: 10}}}", "profiles.w.llm."),
        ("profiles: {w: {llm: {colour: red}}}", "profiles.w.llm.colour"),
        ("profiles: {w: {mcp: [files]}}", "profiles.w.mcp: no MCP server 'files'"),
        ("profiles: {w: {tools: [files__read]}}", "profiles.w.tools: 'files__read' is no MCP"),
        ("profiles: {w: {home: nowhere}}", "not of the form platform:chat"),
        ("profiles: {w: {colour: red}}", "profiles.w.colour: unknown key"),
        ("bindings: [{profile: work, platform: telegram}]", "bindings[0].profile: no profile"),
        (
            "profiles: {w: {}}\nbindings: [{profile: w, platform: t}, {profile: default, "
            "platform: t}]",
            "bindings[1]: binds platform=t again",
        ),
        ("bindings: [{profile: default, chat: '5'}]", "a binding with a chat names its platform"),
        (
            "bindings: [{profile: default, platform: t, thread: '1'}]",
            "a binding with a thread names its chat",
        ),
        ("bindings: [{profile: default, platform: ''}]", "leave the key out"),
        (
            "triggers: {t: {scheme: github, secret: 0123456789abcdef0, prompt: p, profile: nope}}",
            "triggers.t.profile: no profile 'nope'",
        ),
    ],
)
def test_bad_profiles_and_bindings_are_refused_naming_the_key(
    tmp_path: Path, text: str, expected: str
) -> None:
    assert expected in error(tmp_path, text)


def test_the_most_specific_binding_wins() -> None:
    rules = [
        Binding("a", "telegram"),
        Binding("b", "telegram", "family"),
        Binding("c", "telegram", None, "123"),
        Binding("d", "telegram", None, "123", "7"),
        Binding("e"),
    ]
    assert choose(rules, "telegram", "default", "9", None) == "a"
    assert choose(rules, "telegram", "family", "9", None) == "b"
    assert choose(rules, "telegram", "family", "123", None) == "c"  # chat beats account
    assert choose(rules, "telegram", "family", "123", "7") == "d"  # thread beats chat
    assert choose(rules, "slack", "default", "123", None) == "e"  # matches everything
    assert choose(rules[:4], "slack", "default", "123", None) == "default"


def test_among_equals_a_cli_binding_wins_then_the_first_written() -> None:
    first, second = Binding("a", "telegram"), Binding("b", "telegram")
    assert choose([first, second], "telegram", "x", "1", None) == "a"
    cli = Binding("c", "telegram", source="cli")
    assert choose([first, second, cli], "telegram", "x", "1", None) == "c"


def test_a_profile_may_name_the_tools_of_a_configured_mcp_server(tmp_path: Path) -> None:
    cfg = load(
        tmp_path,
        "mcp: {servers: {files: {command: cat}, gh: {url: 'https://x.example/mcp', prefix: git}}}\n"
        "profiles: {w: {tools: [memory, files__read, git__issue], mcp: [files, gh]}}",
    )
    assert cfg.profiles["w"].tools == ("memory", "files__read", "git__issue")
    assert "profiles.w.tools: 'gh__issue'" in error(
        tmp_path,
        "mcp: {servers: {gh: {url: 'https://x.example/mcp', prefix: git}}}\n"
        "profiles: {w: {tools: [gh__issue]}}",
    )


def test_bindings_written_with_numbers_match_chat_ids(tmp_path: Path) -> None:
    cfg = load(tmp_path, "profiles: {w: {}}\nbindings: [{profile: w, platform: t, chat: 123}]")
    assert choose(cfg.binding_rules(), "t", "default", "123", None) == "w"


def test_the_model_field_names_a_profile() -> None:
    assert parse_model("herald:work") == "work"
    assert parse_model("herald") is None
    assert parse_model("gpt-4o") is None
    assert parse_model(None) is None


def test_a_profiles_api_key_is_a_secret_masked_and_redacted(tmp_path: Path) -> None:
    key_file = tmp_path / "work.key"
    key_file.write_text("sk-work-0123456789\n", encoding="utf-8")
    cfg = load(
        tmp_path,
        f"""
profiles:
  work: {{llm: {{api_key_file: {key_file}, base_url: "http://127.0.0.1:9/v1"}}}}
  home: {{llm: {{api_key: sk-home-0123456789}}}}
""",
    )
    work = cfg.profile_llm("work").api_key
    assert work is not None
    assert work.get_secret_value() == "sk-work-0123456789"
    shown = str(masked(cfg))
    assert "sk-work" not in shown
    assert "sk-home" not in shown
    redact = Redactor.of(cfg)
    assert redact("keys sk-work-0123456789 sk-home-0123456789") == "keys *** ***"


def test_the_model_key_never_goes_to_a_profiles_model_on_another_host(tmp_path: Path) -> None:
    cfg = load(
        tmp_path,
        """
llm: {base_url: "https://api.example.com/v1", api_key: top-secret-key, model: m1}
profiles:
  elsewhere: {llm: {base_url: "http://203.0.113.9:11434/v1", model: llama}}
  same: {llm: {base_url: "https://API.example.com:443/v2", model: m2}}
  own: {llm: {base_url: "http://203.0.113.9:11434/v1", api_key: its-own}}
  model_only: {llm: {model: m3}}
""",
    )
    # A model on another host gets no key of the top-level model's …
    assert cfg.profile_llm("elsewhere").api_key is None
    # … one on the same server (scheme, host, port) does, as does a profile naming no server.
    same, model_only = cfg.profile_llm("same").api_key, cfg.profile_llm("model_only").api_key
    assert same is not None
    assert same.get_secret_value() == "top-secret-key"
    assert model_only is not None
    assert model_only.get_secret_value() == "top-secret-key"
    own = cfg.profile_llm("own").api_key
    assert own is not None
    assert own.get_secret_value() == "its-own"


def test_the_openai_key_never_goes_to_a_profiles_local_model(tmp_path: Path) -> None:
    cfg = load(
        tmp_path,
        """
llm: {api_key: sk-openai, model: gpt-4o-mini}
profiles:
  family: {llm: {base_url: "http://127.0.0.1:11434/v1", model: llama3.1}}
""",
    )
    assert cfg.profile_llm("family").api_key is None
