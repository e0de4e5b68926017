"""The schema. Alembic migrations under `migrations/` create and change it."""

from __future__ import annotations

from sqlalchemy import (
    JSON,
    Boolean,
    Column,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Table,
    Text,
    UniqueConstraint,
)
from sqlalchemy import (
    false as sa_false,
)
from sqlalchemy import (
    true as sa_true,
)

from gateway.store.types import BigId, SafeText, UTCDateTime

metadata = MetaData(
    naming_convention={
        "ix": "ix_%(table_name)s_%(column_0_N_name)s",
        "uq": "uq_%(table_name)s_%(column_0_N_name)s",
        "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
        "pk": "pk_%(table_name)s",
    }
)

users = Table(
    "users",
    metadata,
    Column("id", String(64), primary_key=True),
    Column("display_name", SafeText, nullable=False, default=""),
    Column("created_at", UTCDateTime, nullable=False),
)

identities = Table(
    "identities",
    metadata,
    Column("id", BigId, primary_key=True, autoincrement=True),
    Column("user_id", String(64), ForeignKey("users.id", ondelete="CASCADE"), nullable=False),
    Column("platform", String(32), nullable=False),
    Column("external_id", SafeText, nullable=False),
    Column("created_at", UTCDateTime, nullable=False),
    UniqueConstraint("platform", "external_id"),
)

sessions = Table(
    "sessions",
    metadata,
    Column("id", BigId, primary_key=True, autoincrement=True),
    Column("key", SafeText, nullable=False),
    Column("epoch", Integer, nullable=False, default=0),
    # Incremented by /new: the highest epoch of a key is its current session.
    Column("platform", String(32), nullable=False),
    Column("user_id", String(64), ForeignKey("users.id", ondelete="SET NULL"), nullable=True),
    Column("busy_mode", String(16), nullable=True),
    Column("title", SafeText, nullable=True),
    Column("user_snapshot", SafeText, nullable=False, default=""),
    Column("memory_snapshot", SafeText, nullable=False, default=""),
    Column("skills_snapshot", SafeText, nullable=False, default="", server_default=""),
    Column("created_at", UTCDateTime, nullable=False),
    Column("updated_at", UTCDateTime, nullable=False),
    Column("message_count", Integer, nullable=False, default=0),
    Column("profile", String(32), nullable=False, default="default", server_default="default"),
    # The profile that answers the session (a chat bound to another one starts a new session).
    UniqueConstraint("key", "epoch"),
    Index(None, "updated_at"),
    Index(None, "user_id", "updated_at"),
)

turns = Table(
    "turns",
    metadata,
    Column("id", BigId, primary_key=True, autoincrement=True),
    Column("session_id", BigId, ForeignKey("sessions.id", ondelete="CASCADE"), nullable=False),
    Column("status", String(16), nullable=False),
    # running, completed, failed, interrupted.
    Column("started_at", UTCDateTime, nullable=False),
    Column("finished_at", UTCDateTime, nullable=True),
    Column("prompt_tokens", Integer, nullable=True),
    Column("completion_tokens", Integer, nullable=True),
    Column("error", SafeText, nullable=True),
    Column("idempotency_key", String(256), nullable=True),
    # The `Idempotency-Key` of the API request the turn answers (migration 0012).
    Index(None, "session_id", "id"),
    Index(None, "status"),
    Index(None, "session_id", "idempotency_key"),
    Index(None, "started_at"),  # the console's charts (migration 0013)
)

messages = Table(
    "messages",
    metadata,
    Column("id", BigId, primary_key=True, autoincrement=True),
    Column("session_id", BigId, ForeignKey("sessions.id", ondelete="CASCADE"), nullable=False),
    Column("turn_id", BigId, ForeignKey("turns.id", ondelete="SET NULL"), nullable=True),
    Column("role", String(16), nullable=False),
    # user, assistant, tool.
    Column("content", SafeText, nullable=False, default=""),
    Column("tool_calls", JSON, nullable=True),
    Column("tool_call_id", SafeText, nullable=True),
    Column("name", SafeText, nullable=True),
    Column("interrupted", Boolean, nullable=False, default=False),
    Column("created_at", UTCDateTime, nullable=False),
    Column("owner", Text, nullable=True),
    # The session's user id as lowercase hex of its UTF-8 (`owner_key`), or NULL: one token in
    # the full-text index, so a user's search narrows by it there. Set by the store on insert;
    # a trigger on `sessions` rewrites it when the session's user changes (migration 0006).
    Index(None, "session_id", "id"),
)

summaries = Table(
    "summaries",
    metadata,
    Column("id", BigId, primary_key=True, autoincrement=True),
    Column("session_id", BigId, ForeignKey("sessions.id", ondelete="CASCADE"), nullable=False),
    Column("upto_message_id", BigId, nullable=False),
    # Every message of the session with an id up to this one is covered by the summary.
    Column("content", SafeText, nullable=False),
    Column("created_at", UTCDateTime, nullable=False),
    Index(None, "session_id", "id"),
)

inbox = Table(
    "inbox",
    metadata,
    Column("id", BigId, primary_key=True, autoincrement=True),
    Column("platform", String(32), nullable=False),
    Column("account", SafeText, nullable=False),
    Column("platform_message_id", SafeText, nullable=False),
    Column("session_key", SafeText, nullable=False),
    Column("chat_id", SafeText, nullable=False),
    Column("thread_id", SafeText, nullable=True),
    Column("sender_id", SafeText, nullable=False),
    Column("sender_name", SafeText, nullable=False, default=""),
    Column("text", SafeText, nullable=False),
    Column("payload", JSON, nullable=True),
    Column("received_at", UTCDateTime, nullable=False),
    Column("accepted_at", UTCDateTime, nullable=False),
    Column("status", String(16), nullable=False, default="pending"),
    # pending (waiting for its turn), running, done.
    Column("outcome", String(16), nullable=True),
    # answered, merged, steered, dropped, rejected; set exactly once.
    Column("outcome_detail", SafeText, nullable=True),
    Column("turn_id", BigId, ForeignKey("turns.id", ondelete="SET NULL"), nullable=True),
    # The turn that took the message; set while running, kept with the outcome. A pending
    # message with a turn id was cut off by a stop: its user message is already in history.
    Column("user_id", String(64), nullable=True),
    Column("is_direct", Boolean, nullable=False, default=True, server_default=sa_true()),
    Column("kind", String(16), nullable=False, default="message", server_default="message"),
    # message or command (commands bypass the queue).
    Column("priority", Integer, nullable=False, default=0, server_default="0"),
    # Higher runs first: an interrupting message is handled before the queue.
    Column("steer", Boolean, nullable=False, default=False, server_default=sa_false()),
    # Waiting to be injected into the running turn (busy mode steer).
    Column("attempts", Integer, nullable=False, default=0, server_default="0"),
    # Turns started for this message; bounded so a message that kills the process is dropped.
    Column("claimed_by", String(128), nullable=True),
    # The instance running this command row (given back when that instance is gone).
    UniqueConstraint("platform", "account", "platform_message_id"),
    Index(None, "session_key", "status", "id"),
    Index(None, "status", "id"),
    Index(None, "received_at"),  # the console's charts (migration 0013)
)

outbox = Table(
    "outbox",
    metadata,
    Column("id", BigId, primary_key=True, autoincrement=True),
    Column("idempotency_key", SafeText, nullable=False, unique=True),
    Column("session_id", BigId, ForeignKey("sessions.id", ondelete="CASCADE"), nullable=True),
    Column("turn_id", BigId, ForeignKey("turns.id", ondelete="SET NULL"), nullable=True),
    Column("chunk_index", Integer, nullable=False, default=0),
    Column("platform", String(32), nullable=False),
    Column("account", SafeText, nullable=False),
    Column("chat_id", SafeText, nullable=False),
    Column("thread_id", SafeText, nullable=True),
    Column("reply_to", SafeText, nullable=True),
    Column("text", SafeText, nullable=False),
    Column("format", String(16), nullable=False, default="markdown"),
    Column("status", String(16), nullable=False, default="pending"),
    # pending, sending, sent, dead.
    Column("attempts", Integer, nullable=False, default=0),
    Column("next_attempt_at", UTCDateTime, nullable=False),
    Column("last_error", SafeText, nullable=True),
    Column("recovered", Boolean, nullable=False, default=False),
    Column("created_at", UTCDateTime, nullable=False),
    Column("sent_at", UTCDateTime, nullable=True),
    Column("platform_message_id", SafeText, nullable=True),
    Column("kind", String(16), nullable=False, default="reply", server_default="reply"),
    # reply (of a turn), notice (acknowledgement, error, command answer), send (a tool), report.
    Column("edit_of", SafeText, nullable=True),
    # Deliver by editing this already-sent message (the streamed preview) instead of sending.
    Column("inbox_id", BigId, nullable=True),
    # The inbound message this chunk answers, when there is one.
    Column("receipt", String(16), nullable=True),
    # The platform's later report on a sent chunk (delivered, failed, undelivered, read…).
    Column("job_run_id", BigId, nullable=True),
    Column("buttons", JSON, nullable=True),
    # [[label, command], …]: buttons under the message where the platform has them.
    # The scheduled job run this report chunk delivers, when there is one.
    Column("claimed_by", String(128), nullable=True),
    # The instance that set the chunk `sending` (its unknown outcome is recovered when that
    # instance is gone).
    Column("attachment", JSON(none_as_null=True), nullable=True),
    # The file this chunk delivers (path, mime_type, size, filename); NULL for text chunks.
    Index(None, "status", "next_attempt_at"),
    Index(None, "platform", "account", "chat_id", "id"),
    Index(None, "platform", "platform_message_id"),
    Index(None, "created_at"),  # the console's charts (migration 0013)
)

jobs = Table(
    "jobs",
    metadata,
    Column("id", String(64), primary_key=True),
    Column("name", SafeText, nullable=False),
    Column("prompt", SafeText, nullable=False),
    Column("schedule", SafeText, nullable=False),
    Column("timezone", String(64), nullable=False, default="UTC"),
    Column("targets", JSON, nullable=False),
    Column("enabled", Boolean, nullable=False, default=True),
    Column("created_by", SafeText, nullable=False, default=""),
    Column("created_at", UTCDateTime, nullable=False),
    Column("updated_at", UTCDateTime, nullable=False),
    Column("user_id", String(64), nullable=True),
    # The Herald user the job's session belongs to (memory scope, /cron listing).
    Column("timeout", Float, nullable=True),
    # Seconds a run may take; None: `cron.run_timeout`.
    Column("anchor_at", UTCDateTime, nullable=True),
    # Slots before this are never run nor recorded (set on creation, resume, new schedule).
    Column("consecutive_failures", Integer, nullable=False, default=0, server_default="0"),
    Column("failure_notified", Boolean, nullable=False, default=False, server_default=sa_false()),
    # The owner was told about the current streak of failures (reset by a success).
    Column("profile", String(32), nullable=False, default="default", server_default="default"),
    # The profile a run answers as; its `home` is that profile's.
)

profile_bindings = Table(
    "profile_bindings",
    metadata,
    # Bindings made by `herald profiles bind` (the config's are in the config): "" matches
    # anything.
    Column("id", BigId, primary_key=True, autoincrement=True),
    Column("profile", String(32), nullable=False),
    Column("platform", String(32), nullable=False),
    Column("account", String(64), nullable=False),
    Column("chat", SafeText, nullable=False),
    Column("thread", SafeText, nullable=False),
    Column("created_at", UTCDateTime, nullable=False),
    UniqueConstraint("platform", "account", "chat", "thread"),
)

job_runs = Table(
    "job_runs",
    metadata,
    Column("id", BigId, primary_key=True, autoincrement=True),
    Column("job_id", String(64), ForeignKey("jobs.id", ondelete="CASCADE"), nullable=False),
    Column("scheduled_for", UTCDateTime, nullable=False),
    Column("status", String(16), nullable=False),
    # queued (run now, waiting for a scheduler), running, ok, failed, timed_out,
    # interrupted (the process stopped during the run; never re-run), missed.
    Column("delivery_status", String(16), nullable=True),
    # pending, delivered, failed, suppressed.
    Column("output", SafeText, nullable=True),
    Column("error", SafeText, nullable=True),
    Column("started_at", UTCDateTime, nullable=True),
    Column("finished_at", UTCDateTime, nullable=True),
    Column("trigger", String(16), nullable=False, default="schedule", server_default="schedule"),
    # schedule (a slot of the job's schedule) or manual (run now: API, CLI).
    Column("owner", SafeText, nullable=True),
    # The scheduler instance that claimed the run.
    Column("delivery_detail", SafeText, nullable=True),
    Column("session_id", BigId, nullable=True),
    Column("turn_id", BigId, nullable=True),
    UniqueConstraint("job_id", "scheduled_for"),
    Index(None, "status"),
)

pairings = Table(
    "pairings",
    metadata,
    Column("id", BigId, primary_key=True, autoincrement=True),
    Column("code", String(16), nullable=False, unique=True),
    Column("platform", String(32), nullable=False),
    Column("account", SafeText, nullable=False),
    Column("external_id", SafeText, nullable=False),
    Column("chat_id", SafeText, nullable=False),
    Column("display_name", SafeText, nullable=False, default=""),
    Column("status", String(16), nullable=False),
    # pending, approved, revoked (refused or withdrawn), expired.
    Column("created_at", UTCDateTime, nullable=False),
    Column("expires_at", UTCDateTime, nullable=False),
    Column("decided_at", UTCDateTime, nullable=True),
    Index(None, "platform", "status"),
    Index(None, "platform", "external_id"),
)

grants = Table(
    "grants",
    metadata,
    Column("id", BigId, primary_key=True, autoincrement=True),
    Column("platform", String(32), nullable=False),
    Column("external_id", SafeText, nullable=False),
    Column("granted_at", UTCDateTime, nullable=False),
    Column("via", SafeText, nullable=False, default=""),
    # How access was granted: `pairing <code>` or `cli`.
    UniqueConstraint("platform", "external_id"),
)

settings = Table(
    "settings",
    metadata,
    Column("key", String(128), primary_key=True),
    Column("value", SafeText, nullable=False),
    Column("updated_at", UTCDateTime, nullable=False),
)

leases = Table(
    "leases",
    metadata,
    Column("name", SafeText, primary_key=True),
    Column("owner", SafeText, nullable=False),
    Column("token", BigId, nullable=False),
    # Fencing token: grows with every change of owner.
    Column("expires_at", UTCDateTime, nullable=False),
)

instances = Table(
    "instances",
    metadata,
    Column("id", String(128), primary_key=True),
    Column("host", SafeText, nullable=False),
    Column("pid", Integer, nullable=False),
    Column("version", String(32), nullable=False),
    Column("incarnation", BigId, nullable=False),
    # Grows with every start under this id.
    Column("started_at", UTCDateTime, nullable=False),
    Column("heartbeat_at", UTCDateTime, nullable=False),
    # Alive while this is within `cluster.lease_ttl` and `stopped_at` is not set.
    Column("stopped_at", UTCDateTime, nullable=True),
    Column("holds", JSON, nullable=True),
    # The leases it held at its last heartbeat, for `herald instances` and /health.
)

lanes = Table(
    "lanes",
    metadata,
    Column("key", SafeText, primary_key=True),
    # A session key with work under way: at most one instance runs its turns.
    Column("owner", String(128), nullable=False),
    Column("token", BigId, nullable=False),
    # Fencing token: grows with every change of owner; an owner's writes check it.
    Column("turn_id", BigId, nullable=True),
    # The turn running now, if any (another instance then treats the session as busy).
    Column("cancel", SafeText, nullable=True),
    # Why another instance asked that turn to stop (/stop, an interrupting message).
    Column("claimed_at", UTCDateTime, nullable=False),
    Index(None, "owner"),
)

tool_approvals = Table(
    "tool_approvals",
    metadata,
    Column("id", BigId, primary_key=True, autoincrement=True),
    Column("session_key", SafeText, nullable=False),
    Column("turn_id", BigId, nullable=True),
    # The turn whose tool call asked (the latest, when a restart asked again).
    Column("call_key", String(64), nullable=False),
    # sha256 of session, tool and arguments: the same call after a restart finds its row.
    Column("tool", String(128), nullable=False),
    Column("arguments", SafeText, nullable=False),
    Column("requester", SafeText, nullable=True),
    # `platform:id` of the person whose message the turn answered; they (or an operator) decide.
    Column("status", String(16), nullable=False),
    # pending, approved, denied, timed_out, cancelled (the turn was stopped), used.
    Column("asked", Integer, nullable=False, default=1),
    Column("created_at", UTCDateTime, nullable=False),
    Column("expires_at", UTCDateTime, nullable=False),
    Column("decided_at", UTCDateTime, nullable=True),
    Column("decided_by", SafeText, nullable=True),
    Index(None, "session_key", "status"),
    Index(None, "call_key"),
)

memory_syncs = Table(
    "memory_syncs",
    metadata,
    # The external memory provider's queue: one row per turn (or memory edit, or session end)
    # to send, in `id` order per person, deleted once the provider took it.
    Column("id", BigId, primary_key=True, autoincrement=True),
    Column("person", String(64), nullable=False),
    # The Herald user id (linking identities moves the rows to the kept user).
    Column("kind", String(16), nullable=False),
    # turn, memory_write, session_end.
    Column("session_key", SafeText, nullable=False),
    Column("session_id", BigId, nullable=True),
    Column("turn_id", BigId, nullable=True),
    Column("payload", JSON, nullable=False),
    Column("created_at", UTCDateTime, nullable=False),
    Column("attempts", Integer, nullable=False, default=0),
    Column("next_attempt_at", UTCDateTime, nullable=False),
    Column("last_error", SafeText, nullable=True),
    Column("sending_at", UTCDateTime, nullable=True),
    # Set when a try starts: a row found with it set may have reached the provider already
    # (the process died in flight), and is sent as a resend.
    Column("dead_at", UTCDateTime, nullable=True),
    # Set when the row was given up after `memory.sync_max_age`: kept for `herald memory
    # status`, never sent again.
    Index(None, "person", "id"),
    Index(None, "dead_at", "next_attempt_at"),
)

skill_writes = Table(
    "skill_writes",
    metadata,
    Column("id", BigId, primary_key=True, autoincrement=True),
    Column("skill", String(64), nullable=False),
    Column("owner", String(200), nullable=True),
    # The memory owner of a personal skill (u-<user> / g-<chat>); NULL for shared skills.
    Column("category", String(64), nullable=True),
    Column("action", String(16), nullable=False),
    Column("file_path", SafeText, nullable=False),
    Column("before", SafeText, nullable=True),
    Column("after", SafeText, nullable=True),
    Column("diff", SafeText, nullable=False),
    Column("author", String(16), nullable=False),
    Column("status", String(16), nullable=False),
    Column("session_id", BigId, nullable=True),
    Column("turn_id", BigId, nullable=True),
    # Plain ids, no foreign keys: the record of a write outlives the session it came from.
    Column("created_at", UTCDateTime, nullable=False),
    Column("decided_at", UTCDateTime, nullable=True),
    Index(None, "status", "id"),
    Index(None, "skill", "id"),
)

console_sessions = Table(
    "console_sessions",
    metadata,
    # The SHA-256 of a console cookie's random part: the row is the login, the cookie only
    # names it; logging out deletes the row, on every instance at once.
    Column("id", String(64), primary_key=True),
    Column("created_at", UTCDateTime, nullable=False),
    Column("expires_at", UTCDateTime, nullable=False),
    Index(None, "expires_at"),
)

memory_docs = Table(
    "memory_docs",
    metadata,
    # The agent's files, one row each: SOUL.md (owner "", name "soul"), and per memory scope
    # (u-<user> / g-<chat>) USER.md ("user") and MEMORY.md ("memory"). `version` counts the
    # edits; an edit is a read-modify-write of one row inside one transaction.
    Column("owner", String(400), primary_key=True),
    Column("name", String(16), primary_key=True),
    Column("text", SafeText, nullable=False),
    Column("version", Integer, nullable=False),
    Column("updated_at", UTCDateTime, nullable=False),
)

skill_files = Table(
    "skill_files",
    metadata,
    # Every file of every skill (SKILL.md, references, scripts, assets): owner "" for the
    # shared skills, else the memory owner of a personal one; `folder` is the skill's folder
    # relative to its root (`<category>/<name>` or `<name>`, `.quarantine/<name>`); `path` the
    # file's path inside that folder. The skill folders under `state_dir` are a cache of these
    # rows, refreshed when `settings["skills.generation"]` moves.
    Column("owner", String(400), primary_key=True),
    Column("folder", String(200), primary_key=True),
    Column("path", String(400), primary_key=True),
    Column("data", LargeBinary, nullable=False),
    Column("sha256", String(64), nullable=False),
    Column("mode", Integer, nullable=False),
    Column("updated_at", UTCDateTime, nullable=False),
)

blobs = Table(
    "blobs",
    metadata,
    # File bytes by content (SHA-256 hex). With `files.store: database` the bytes are in
    # `blob_chunks`; with `s3` they are in the bucket and this row only records the object.
    Column("key", String(64), primary_key=True),
    Column("size", BigId, nullable=False),
    Column("media_type", String(200), nullable=False, default=""),
    Column("store", String(16), nullable=False),
    Column("created_at", UTCDateTime, nullable=False),
    Column("used_at", UTCDateTime, nullable=False),
    Index(None, "used_at"),
)

blob_chunks = Table(
    "blob_chunks",
    metadata,
    Column("key", String(64), primary_key=True),
    Column("seq", Integer, primary_key=True),
    Column("data", LargeBinary, nullable=False),
)

trigger_runs = Table(
    "trigger_runs",
    metadata,
    # One row per accepted delivery of a trigger (`POST /hooks/<name>`): the claim on its
    # delivery id (UNIQUE trigger + delivery id, so a redelivery finds it and runs nothing),
    # then the run it became. Written before the sender is answered 202.
    Column("id", BigId, primary_key=True, autoincrement=True),
    Column("trigger", String(64), nullable=False),
    Column("delivery_id", String(200), nullable=False),
    Column("status", String(16), nullable=False),
    # queued, running, ok, failed, timed_out, interrupted (cut off twice; never run again).
    Column("event", SafeText, nullable=True),
    # The event the sender named (X-GitHub-Event, X-Gitlab-Event, Stripe's type), if any.
    Column("headers", JSON, nullable=False),
    # The request's headers the filters and the template may read (lower-case names).
    Column("payload", SafeText, nullable=False),
    # The raw body as text (verified; never read as instructions).
    Column("received_at", UTCDateTime, nullable=False),
    Column("started_at", UTCDateTime, nullable=True),
    Column("finished_at", UTCDateTime, nullable=True),
    Column("attempts", Integer, nullable=False, default=0, server_default="0"),
    # Times a run was started (a run cut off by a crash is started once more).
    Column("owner", SafeText, nullable=True),
    Column("session_id", BigId, nullable=True),
    Column("turn_id", BigId, nullable=True),
    Column("output", SafeText, nullable=True),
    Column("error", SafeText, nullable=True),
    Column("delivery_status", String(16), nullable=True),
    # pending, suppressed ([SILENT]), failed (no target could be resolved).
    Column("content_key", String(80), nullable=True),
    # A hash of what the signature covers (the body, or timestamp and body): a captured
    # request replayed under a new delivery id (a header the signature does not cover)
    # finds its row too. NULL for a token scheme (GitLab), which signs nothing.
    UniqueConstraint("trigger", "delivery_id"),
    UniqueConstraint("trigger", "content_key"),
    Index(None, "status", "id"),
    Index(None, "trigger", "id"),
)

session_files = Table(
    "session_files",
    metadata,
    # Files a session holds that no inbound message carries (pictures sent over the HTTP
    # API): what `view_attachment` and `send_file` may reach besides the inbox's attachments.
    Column("id", BigId, primary_key=True, autoincrement=True),
    Column("session_key", SafeText, nullable=False),
    Column("blob", String(64), nullable=False),
    Column("path", SafeText, nullable=False),
    Column("filename", SafeText, nullable=False),
    Column("mime_type", String(200), nullable=False),
    Column("size", BigId, nullable=False),
    Column("created_at", UTCDateTime, nullable=False),
    Index(None, "session_key", "id"),
    Index(None, "created_at"),
)
