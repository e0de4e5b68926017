"""Column types shared by the tables."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import BigInteger, DateTime, Dialect, Integer, Text, TypeDecorator

from gateway.storable import clean

# SQLite only auto-increments an INTEGER PRIMARY KEY; PostgreSQL gets a real BIGINT.
BigId = BigInteger().with_variant(Integer(), "sqlite")


def aware(value: Any) -> datetime:
    """A timestamp read from raw SQL (SQLite hands back text) as an aware UTC datetime."""
    if isinstance(value, str):
        value = datetime.fromisoformat(value)
    assert isinstance(value, datetime)
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


class UTCDateTime(TypeDecorator[datetime]):
    """A timestamp that is always timezone-aware UTC in Python, on every backend."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> Any:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("naive datetime given to the store; use an aware UTC datetime")
        value = value.astimezone(UTC)
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value: Any, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        assert isinstance(value, datetime)
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


class SafeText(TypeDecorator[str]):
    """Unbounded text that every backend accepts: NUL (refused by PostgreSQL) and lone UTF-16
    surrogates (refused by every UTF-8 encoder) become U+FFFD."""

    impl = Text
    cache_ok = True

    def process_bind_param(self, value: str | None, dialect: Dialect) -> Any:
        return None if value is None else clean(value.replace("\x00", "\ufffd"))
