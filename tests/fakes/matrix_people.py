"""The people of the Matrix tests: matrix-nio clients (the library Herald uses) on Synapse."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

from nio import (
    AsyncClient,
    JoinResponse,
    RoomCreateResponse,
    RoomPreset,
    RoomSendResponse,
    UploadResponse,
)

from tests.fakes.synapse import Account


@contextlib.asynccontextmanager
async def person_client(url: str, account: Account) -> AsyncIterator[AsyncClient]:
    """A client logged in as `account` (by its access token), closed at the end."""
    client = AsyncClient(url, account.user_id, device_id=account.device_id)
    client.access_token = account.access_token
    client.user_id = account.user_id
    try:
        yield client
    finally:
        await client.close()


async def open_room(client: AsyncClient, invite: list[str], *, direct: bool) -> str:
    """A new unencrypted room made by `client` with `invite` invited; its id."""
    made = await client.room_create(
        is_direct=direct,
        invite=invite,
        preset=RoomPreset.private_chat,
    )
    assert isinstance(made, RoomCreateResponse), made
    return str(made.room_id)


async def join(client: AsyncClient, room: str) -> None:
    """`client` joins `room` (it was invited)."""
    joined = await client.join(room)
    assert isinstance(joined, JoinResponse), joined


async def open_direct_chat(person: AsyncClient, bot: AsyncClient, bot_id: str) -> str:
    """A direct chat `person` opened with the bot, the bot already in it; its room id."""
    room = await open_room(person, [bot_id], direct=True)
    await join(bot, room)
    return room


async def say_content(client: AsyncClient, room: str, content: dict[str, Any]) -> str:
    """Send one `m.room.message` with `content`; its event id."""
    sent = await client.room_send(room, "m.room.message", content)
    assert isinstance(sent, RoomSendResponse), sent
    return str(sent.event_id)


async def say(client: AsyncClient, room: str, text: str) -> str:
    """Send `text` to `room`; the event id."""
    return await say_content(client, room, {"msgtype": "m.text", "body": text})


async def say_file(client: AsyncClient, room: str, data: bytes, name: str, mime: str) -> str:
    """Upload `data` and send it to `room` as a file (a picture for `image/*`)."""
    uploaded, _ = await client.upload(
        lambda *_: data, content_type=mime, filename=name, filesize=len(data)
    )
    assert isinstance(uploaded, UploadResponse), uploaded
    content = {
        "msgtype": "m.image" if mime.startswith("image/") else "m.file",
        "body": name,
        "url": uploaded.content_uri,
        "info": {"mimetype": mime, "size": len(data)},
    }
    return await say_content(client, room, content)
