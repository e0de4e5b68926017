"""A fake Slack for slack-sdk and slack-bolt: Web API, Socket Mode and Events API, on 127.0.0.1.

slack-sdk and slack-bolt talk to it unmodified but for the Web API base URL:
`AsyncWebClient(bot_token, base_url=slack.base_url)`, then
`slack_sdk.socket_mode.aiohttp.SocketModeClient(app_token, web_client=that_client)` or
`AsyncApp(client=that_client)`; the websocket URL comes from `apps.connections.open`.

Two listeners:
- the Web API (`POST|GET /api/<method>`), the upload URLs, the `url_private*` downloads and the
  `/control/*` routes: Starlette served by uvicorn (`LocalServer`, like the other fakes);
- the Socket Mode websockets (`ws://127.0.0.1:<ws_port>/link/?ticket=...`): aiohttp's web
  server on a second port. Not uvicorn: `LocalServer` serves no websockets (`ws="none"`), and
  through ASGI a server can neither withhold pongs nor hang up without a close frame. aiohttp's
  `WebSocketResponse(autoping=False)` hands pings to the handler (a silenced socket does not
  answer them, and still notices when its client hangs up) and exposes the transport (a dropped
  socket is `transport.abort()`: no close frame). aiohttp is slack-sdk's own websocket client,
  so nothing new is needed; a second port costs nothing since clients learn the URL from
  `apps.connections.open`.

Web API, as slack-sdk sends it: parameters in the query string, a form or a JSON body; the
token in `Authorization: Bearer` (or a `token` parameter). Answers are HTTP 200
`{"ok": true, ...}` / `{"ok": false, "error": "..."}`; an unknown method is 404
`unknown_method`; a rate limit is 429 with `Retry-After` (whole seconds) and
`{"ok": false, "error": "ratelimited"}`; a `fail()` is a plain-text 5xx. Token errors: none
`not_authed`, unknown `invalid_auth`; the app token (`xapp-`) is accepted only by
`apps.connections.open` and the bot token everywhere else, the other way round answers
`not_allowed_token_type`.

Methods: auth.test, apps.connections.open, chat.postMessage, chat.update, chat.delete,
reactions.add, reactions.remove, conversations.info, users.info, files.getUploadURLExternal,
files.completeUploadExternal (and the upload URL in between: what `files_upload_v2` uses).
Files registered with `add_file()` (or uploaded) download from their `url_private` /
`url_private_download` with `Authorization: Bearer <bot token>`; 403 without it.

Channels need no setup: an id starting with C is a public channel, G a private one, D a DM
(`add_channel` names them, makes the bot a non-member, or an mpim); `remove_channel` makes an
id `channel_not_found`. Posting to a user id posts to the DM with that user, as on Slack.

Socket Mode: on connect the server sends `hello`; every event is wrapped in an `events_api`
envelope and sent to one open socket (round robin over the sockets that said hello, are not
silenced and were not told to disconnect); an envelope not acknowledged
(`{"envelope_id": ...}`) within `ack_timeout` is sent again (to any open socket, now or once
one connects) with `retry_attempt` + 1 and `retry_reason` "timeout", up to `max_retries` times,
then given up (`expired`). Each attempt has a new `envelope_id`; an ack of any attempt
acknowledges the event. A ticket (one `apps.connections.open`) opens one websocket; a refused
handshake does not use it up.

Events API: `use_events_api(url)` makes the server POST every event to `url` instead (signed
with the signing secret: `X-Slack-Request-Timestamp`, `X-Slack-Signature`), retrying an answer
that is not 2xx within `events_timeout` after `events_retry_delay` with `X-Slack-Retry-Num` /
`X-Slack-Retry-Reason` (none after an `X-Slack-No-Retry: 1` answer). `signed_request()` and
`url_verification_request()` build such requests, right or wrong, for tests to send.

Interactivity: `press_button(channel, ts, value, user=...)` presses a button of a bot's message
(its blocks, as posted: `Posted.blocks`): a `block_actions` payload in an `interactive` envelope
(Socket Mode, acknowledged like events), or POSTed form-encoded (`payload=<json>`, signed) to
`interactivity_url` (default: the events URL). `inject_interactive(payload)` queues any other
interactivity payload (a shortcut, a form) the same way.

In tests: `async with FakeSlackServer() as slack:`, then `slack.inject_message(...)`,
`inject_app_mention`, `inject_edit`, `inject_delete`, `inject_bot_message`,
`inject_own_message`, `inject_event`, `press_button`; faults (`rate_limit`, `fail`, `drop`,
`drop_socket`, `send_disconnect`, `silence_socket`, `ignore_acks`, `refuse_connections`; the
counted ones count down) and records (`posted`, `updates`, `deleted`, `reactions`, `uploads`,
`calls`, `rejected`, `envelopes`, `acks`, `sockets`, `open_sockets`, `max_open_sockets`,
`texts_in()`, waits). Another process drives the server through `/control/*` (see
`SlackServerClient`). Standalone: `python -m tests.fakes.slack --port 8102 --bot-token
xoxb-... --app-token xapp-...` serves until SIGTERM / SIGINT; its first line on stdout ends
with the root URL."""

from tests.fakes.slack.client import SlackServerClient, main
from tests.fakes.slack.records import (
    DEFAULT_ACK_TIMEOUT,
    DEFAULT_APP_TOKEN,
    DEFAULT_BOT_TOKEN,
    DEFAULT_MAX_RETRIES,
    DEFAULT_SIGNING_SECRET,
    DEFAULT_USER,
    JSON,
    MAX_TEXT_LENGTH,
    MAX_WAIT,
    STALE_AFTER,
    Ack,
    Call,
    ChannelKind,
    Deleted,
    Download,
    Envelope,
    HttpDelivery,
    Injected,
    Posted,
    ReactionChange,
    Rejected,
    SignedRequest,
    SocketInfo,
    Stage,
    StoredFile,
    Updated,
    Upload,
    slack_signature,
)
from tests.fakes.slack.server import FakeSlackServer

__all__ = [
    "DEFAULT_ACK_TIMEOUT",
    "DEFAULT_APP_TOKEN",
    "DEFAULT_BOT_TOKEN",
    "DEFAULT_MAX_RETRIES",
    "DEFAULT_SIGNING_SECRET",
    "DEFAULT_USER",
    "JSON",
    "MAX_TEXT_LENGTH",
    "MAX_WAIT",
    "STALE_AFTER",
    "Ack",
    "Call",
    "ChannelKind",
    "Deleted",
    "Download",
    "Envelope",
    "FakeSlackServer",
    "HttpDelivery",
    "Injected",
    "Posted",
    "ReactionChange",
    "Rejected",
    "SignedRequest",
    "SlackServerClient",
    "SocketInfo",
    "Stage",
    "StoredFile",
    "Updated",
    "Upload",
    "main",
    "slack_signature",
]
