"""A test-only platform: a small long-polling chat protocol spoken by `tests/fakes/chat_server.py`.

It exists so that Herald's message path (inbox, busy modes, outbox, delivery, crash safety) can
be exercised end to end, through `herald run`, before and besides the real platform adapters.
"""
