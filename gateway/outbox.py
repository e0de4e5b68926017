"""Transitional: the outbox repository lives in `gateway.store.outbox`.

Kept only for `gateway/sessions.py` until it imports `gateway.store.outbox` itself; nothing
else may import this module.
"""

from gateway.store.outbox import Chunk, Outbox, Target, enqueue, reply_chunks

__all__ = ["Chunk", "Outbox", "Target", "enqueue", "reply_chunks"]
