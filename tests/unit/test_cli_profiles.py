"""`herald profiles …`: list and show read the config and the stored bindings; bind and
unbind store bindings in the database, refusing unknown profiles and bad bindings."""

from __future__ import annotations

import json

import pytest

from agent_core.memory import MemoryFiles, MemoryScope, NamespacedDocs, person
from gateway.store import Store
from gateway.store.memory_docs import SqlMemoryDocs
from gateway.store.profiles import StoredBindings
from tests.unit.cli_harness import Herald

pytestmark = [pytest.mark.timeout(60), pytest.mark.usefixtures("clean_environment")]


async def test_bind_list_show_unbind(herald: Herald) -> None:
    herald.configure(
        llm={"model": "m1"},
        home={"targets": ["telegram:1"]},
        profiles={"work": {"llm": {"model": "m2"}, "home": "telegram:2", "tools": ["memory"]}},
        bindings=[{"profile": "work", "platform": "telegram", "account": "work"}],
    )
    listed = await herald.invoke("profiles", "list")
    assert listed.exit_code == 0, listed.output
    assert "default" in listed.output
    assert "work" in listed.output
    assert "platform=telegram account=work" in listed.output

    bound = await herald.invoke(
        "profiles", "bind", "work", "--platform", "telegram", "--chat", "42"
    )
    assert bound.exit_code == 0, bound.output
    assert "bound platform=telegram chat=42 to work" in bound.output
    again = await herald.invoke(
        "profiles", "bind", "default", "--platform", "telegram", "--chat", "42"
    )
    assert "rebound platform=telegram chat=42 to default" in again.output
    async with Store.open(herald.database_url) as store:
        [stored] = await StoredBindings(store).list()
    assert (stored.profile, stored.platform, stored.chat, stored.source) == (
        "default",
        "telegram",
        "42",
        "cli",
    )

    shown = await herald.invoke("profiles", "show", "work", "--json")
    assert shown.exit_code == 0, shown.output
    [work] = json.loads(shown.output)
    assert work["model"] == "m2"
    assert work["api_model"] == "herald:work"
    assert work["memory"] == "work"
    assert work["tools"] == ["memory"]
    assert work["home"] == ["telegram:2"]
    assert [b["source"] for b in work["bindings"]] == ["config"]

    unbound = await herald.invoke("profiles", "unbind", "--platform", "telegram", "--chat", "42")
    assert unbound.exit_code == 0, unbound.output
    missing = await herald.invoke("profiles", "unbind", "--platform", "telegram", "--chat", "42")
    assert missing.exit_code == 1
    in_config = await herald.invoke(
        "profiles", "unbind", "--platform", "telegram", "--account", "work"
    )
    assert in_config.exit_code == 1
    assert "it is in the config file" in in_config.output


async def test_bad_bindings_are_refused_and_store_nothing(herald: Herald) -> None:
    herald.configure(profiles={"work": {}})
    unknown = await herald.invoke("profiles", "bind", "nope", "--platform", "telegram")
    assert unknown.exit_code == 1
    assert "no profile 'nope' (profiles: default, work)" in unknown.output
    loose = await herald.invoke("profiles", "bind", "work", "--chat", "5")
    assert loose.exit_code == 1
    assert "a binding with a chat names its platform too" in loose.output
    shown = await herald.invoke("profiles", "show", "nope")
    assert shown.exit_code == 1
    listed = await herald.invoke("profiles", "list")
    assert "no bindings: the default profile answers everywhere" in listed.output


async def test_users_link_merges_each_profiles_memory_too(herald: Herald) -> None:
    herald.configure(profiles={"work": {}, "family": {"memory": {"namespace": "default"}}})
    async with Store.open(herald.database_url) as store:
        kept = await store.resolve_user("telegram", "1")
        merged = await store.resolve_user("email", "a@x")
        work = MemoryFiles(NamespacedDocs(SqlMemoryDocs(store), "work"))
        await work.add(MemoryScope.USER, person(merged), "Works on Herald")
    result = await herald.invoke("users", "link", "telegram:1", "email:a@x")
    assert result.exit_code == 0, result.output
    async with Store.open(herald.database_url) as store:
        work = MemoryFiles(NamespacedDocs(SqlMemoryDocs(store), "work"))
        assert await work.read(MemoryScope.USER, person(kept)) == "- Works on Herald\n"
        assert await work.read(MemoryScope.USER, person(merged)) == ""
        # The default namespace never saw it.
        default = MemoryFiles(SqlMemoryDocs(store))
        assert await default.read(MemoryScope.USER, person(kept)) == ""
