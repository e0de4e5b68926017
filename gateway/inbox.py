"""Transitional: the inbox repository lives in `gateway.store.inbox`.

Kept only for `gateway/sessions.py` until it imports `gateway.store.inbox` itself; nothing
else may import this module.
"""

from gateway.store.inbox import (
    Inbox,
    InboxRow,
    Outcome,
    Status,
    count_waiting,
    insert,
    pending,
    requeue,
    restore_pending,
    settle,
    take,
    take_command,
)

__all__ = [
    "Inbox",
    "InboxRow",
    "Outcome",
    "Status",
    "count_waiting",
    "insert",
    "pending",
    "requeue",
    "restore_pending",
    "settle",
    "take",
    "take_command",
]
