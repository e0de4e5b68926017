"""Two instances on one database sharing the state directory see the same operator skills
and the same write journal (SQLite and PostgreSQL; in-process)."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent_core.agent import Agent, AgentSettings
from agent_core.memory import MemoryFiles
from agent_core.skills.install import install_folder
from agent_core.skills.model import SkillAction, SkillWrite, WriteStatus
from agent_core.skills.service import Actor, Author, Request, Skills, SkillSettings
from agent_core.skills.store import SkillStore
from agent_core.tools import ToolRegistry
from gateway.contracts.ids import SessionKey
from gateway.store import Store
from gateway.store.skills import SkillWrites
from tests.unit.agent.fakes import ScriptedProvider
from tests.unit.skills.helpers import make_skill, skill_text

pytestmark = pytest.mark.timeout(60)


def instance(state: Path, store: Store, *, approval: bool = False) -> Agent:
    memory = MemoryFiles(state)
    skills = Skills(SkillStore(state), SkillWrites(store), SkillSettings(write_approval=approval))
    return Agent(
        ScriptedProvider(),
        store,
        memory,
        ToolRegistry(),
        AgentSettings(memory_pass=False),
        skills=skills,
    )


def skills_of(agent: Agent) -> Skills:
    assert agent.skills is not None
    return agent.skills


async def test_two_instances_share_operator_skills_and_the_journal(
    store_url: str, tmp_path: Path
) -> None:
    state = tmp_path / "shared-state"
    state.mkdir()
    async with Store.open(store_url) as store_a, Store.open(store_url) as store_b:
        a = instance(state, store_a)
        b = instance(state, store_b, approval=True)
        # The operator installs a skill through instance A's side.
        source = make_skill(tmp_path / "incoming", "team-standup", "Run the team standup.")
        done = install_folder(skills_of(a).store, source)
        assert done.change is not None
        journal_a = skills_of(a).journal
        assert journal_a is not None
        await journal_a.record(SkillWrite(done.change, "operator", WriteStatus.APPLIED))

        ann = await store_b.resolve_user("telegram", "1", "Ann")
        session = await store_b.open_session(
            SessionKey("telegram:bot:1"), platform="telegram", user_id=ann, snapshot=b.snapshot
        )
        assert "- team-standup: Run the team standup." in session.skills_snapshot

        # B's agent asks for a write (approval on there); A's operator approves it.
        actor = Actor(MemoryFiles(state).owner(session.key, ann), Author.AGENT)
        held = await skills_of(b).manage(
            Request(SkillAction.CREATE, "anns-notes", skill_text("anns-notes")), actor
        )
        assert "write #2" in held
        pending = await SkillWrites(store_a).writes(status=WriteStatus.PENDING)
        assert [(w.id, w.change.skill) for w in pending] == [(2, "anns-notes")]
        await skills_of(a).approve(2)
        assert "anns-notes" in skills_of(b).index(actor.owner)
        assert "anns-notes" not in skills_of(b).index(None)
        writes = await SkillWrites(store_b).writes()
        assert [(w.change.skill, w.status) for w in writes] == [
            ("anns-notes", WriteStatus.APPROVED),
            ("team-standup", WriteStatus.APPLIED),
        ]
