"""Skills: the shared ones and each person's own, those held in quarantine (with the
reason), and the agent's writes waiting for approval (with their diff), approved or
rejected here through the same `Skills` service `herald skills` uses."""

from __future__ import annotations

import logging
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, Response

from agent_core.memory import person
from agent_core.skills.format import SkillFormatError
from agent_core.skills.install import quarantined
from agent_core.skills.model import SkillError, WriteStatus
from agent_core.skills.service import Skills
from gateway.http.console.page import Console, ConsoleDep, Posted, Refused, Who, done
from gateway.http.console.section import Section
from gateway.store import Store

logger = logging.getLogger("gateway.console")
router = APIRouter(prefix="/skills")
SECTION = Section("skills", "Skills", router)
RECENT_WRITES = 20


def _skills(console: Console) -> Skills:
    skills = console.deps.skills
    if skills is None:
        raise Refused(404, "Skills are turned off (skills.enabled: false).")
    return skills


async def _page(skills: Skills, users: Store) -> dict[str, Any]:
    store = skills.store
    people = [(owner, store.personal(owner)) for owner in store.owners()]
    names: dict[str, str] = {person(user_id): name for user_id, name, _ in await users.list_users()}
    journal = skills.journal
    pending = [] if journal is None else await journal.writes(status=WriteStatus.PENDING)
    recent = [] if journal is None else await journal.writes(limit=RECENT_WRITES)
    return {
        "shared": store.shared(),
        "people": [(owner, names.get(owner), found) for owner, found in people if found],
        "quarantined": quarantined(store),
        "pending": pending,
        "recent": [w for w in recent if w.status is not WriteStatus.PENDING],
        "journal": journal is not None,
        "write_approval": skills.settings.write_approval,
    }


@router.get("", response_class=HTMLResponse)
async def skills_page(request: Request, console: ConsoleDep, who: Who) -> Response:
    """Every skill by where it lives, quarantined ones, and the writes waiting for approval."""
    skills = console.deps.skills
    context = (
        {"enabled": False}
        if skills is None
        else {"enabled": True, **await _page(skills, console.deps.store)}
    )
    return console.render(request, "skills.html", current=SECTION.slug, title="Skills", **context)


@router.post("/writes/{write_id}/approve")
async def approve(write_id: int, console: ConsoleDep, posted: Posted) -> Response:
    """Apply a pending write (as `herald skills approve`)."""
    try:
        text = await _skills(console).approve(write_id)
    except SkillError as err:
        raise Refused(409, f"{err}.") from err
    except LookupError as err:
        raise Refused(404, f"{err}.") from err
    logger.info("console: skill write #%d approved by %s: %s", write_id, posted.who, text)
    return done(SECTION.path, "skill-approved", write_id)


@router.post("/writes/{write_id}/reject")
async def reject(write_id: int, console: ConsoleDep, posted: Posted) -> Response:
    """Refuse a pending write; nothing is written (as `herald skills reject`)."""
    try:
        await _skills(console).reject(write_id)
    except SkillError as err:
        raise Refused(409, f"{err}.") from err
    logger.info("console: skill write #%d rejected by %s", write_id, posted.who)
    return done(SECTION.path, "skill-rejected", write_id)


@router.post("/share")
async def share(console: ConsoleDep, posted: Posted) -> Response:
    """Share a person's skill with everyone (as `herald skills share`)."""
    owner, name = posted.form.get("owner", ""), posted.form.get("name", "")
    try:
        shared = await _skills(console).share(owner, name)
    except (SkillError, SkillFormatError) as err:
        raise Refused(409, f"{err}.") from err
    logger.info("console: skill %r of %s shared with everyone by %s", name, owner, posted.who)
    return done(SECTION.path, "skill-shared", shared.name)
