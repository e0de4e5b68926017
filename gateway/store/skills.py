"""The skill write journal in SQL: every write to a skill (who, when, which turn, the
diff), and the writes waiting for the operator's approval. Implements
`agent_core.skills.SkillJournal`."""

from __future__ import annotations

from sqlalchemy import RowMapping, insert, select, update

from agent_core.skills.model import SkillAction, SkillChange, SkillWrite, WriteStatus
from gateway.contracts.ids import SessionId
from gateway.contracts.messages import utcnow
from gateway.store import Store
from gateway.store.tables import skill_writes, turns
from gateway.store.types import aware


class SkillWrites:
    """The `skill_writes` table."""

    def __init__(self, store: Store) -> None:
        self.store = store

    async def record(self, write: SkillWrite) -> int:
        """Store `write` with its diff and the latest turn of its session; return its id."""
        change = write.change
        async with self.store.write() as conn:
            turn_id = write.turn_id
            if turn_id is None and write.session_id is not None:
                turn_id = await conn.scalar(
                    select(turns.c.id)
                    .where(turns.c.session_id == write.session_id)
                    .order_by(turns.c.id.desc())
                    .limit(1)
                )
            new_id = await conn.scalar(
                insert(skill_writes)
                .values(
                    skill=change.skill,
                    owner=change.owner,
                    category=change.category,
                    action=str(change.action),
                    file_path=change.file_path,
                    before=change.before,
                    after=change.after,
                    diff=change.diff(),
                    author=write.author,
                    status=str(write.status),
                    session_id=write.session_id,
                    turn_id=turn_id,
                    created_at=write.created_at or utcnow(),
                )
                .returning(skill_writes.c.id)
            )
        assert new_id is not None
        return int(new_id)

    async def writes(
        self, *, status: WriteStatus | None = None, skill: str | None = None, limit: int = 100
    ) -> list[SkillWrite]:
        """Recorded writes, newest first, filtered by status and skill name."""
        query = select(skill_writes).order_by(skill_writes.c.id.desc()).limit(limit)
        if status is not None:
            query = query.where(skill_writes.c.status == str(status))
        if skill is not None:
            query = query.where(skill_writes.c.skill == skill)
        async with self.store.read() as conn:
            rows = (await conn.execute(query)).mappings().all()
        return [_write(r) for r in rows]

    async def get(self, write_id: int) -> SkillWrite:
        """One write. Raises LookupError when there is none of that id."""
        async with self.store.read() as conn:
            row = (
                (await conn.execute(select(skill_writes).where(skill_writes.c.id == write_id)))
                .mappings()
                .first()
            )
        if row is None:
            raise LookupError(f"there is no skill write #{write_id}")
        return _write(row)

    async def decide(self, write_id: int, status: WriteStatus) -> bool:
        """Mark a pending write approved or rejected; False when it was not pending."""
        async with self.store.write() as conn:
            result = await conn.execute(
                update(skill_writes)
                .where(
                    skill_writes.c.id == write_id,
                    skill_writes.c.status == str(WriteStatus.PENDING),
                )
                .values(status=str(status), decided_at=utcnow())
            )
        return bool(result.rowcount)


def _write(row: RowMapping) -> SkillWrite:
    change = SkillChange(
        SkillAction(row["action"]),
        str(row["skill"]),
        row["owner"],
        str(row["file_path"]),
        row["before"],
        row["after"],
        row["category"],
    )
    return SkillWrite(
        change,
        str(row["author"]),
        WriteStatus(row["status"]),
        None if row["session_id"] is None else SessionId(row["session_id"]),
        id=int(row["id"]),
        turn_id=None if row["turn_id"] is None else int(row["turn_id"]),
        created_at=aware(row["created_at"]),
        decided_at=None if row["decided_at"] is None else aware(row["decided_at"]),
    )
