"""Herald's SQL state: SQLAlchemy 2 async on SQLite (default) or PostgreSQL."""

from gateway.store.store import SnapshotFactory, Store

__all__ = ["SnapshotFactory", "Store"]
