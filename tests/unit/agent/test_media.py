"""Pictures for the model (scaling, conversion, the vision step and its limits) and the media
tools (`view_attachment`, `send_file`): what each shows, queues or refuses."""

from __future__ import annotations

import asyncio
import base64
import io
import struct
import zlib
from collections.abc import Sequence
from datetime import UTC, datetime
from hashlib import sha256
from pathlib import Path

import pytest
from PIL import Image
from pydantic import ValidationError

from agent_core.config import MediaConfig
from agent_core.loop import TurnProgress, run_tool_loop
from agent_core.media import Destination, TurnMedia, Vision, VisionSettings
from agent_core.media.images import ImageTooLarge, UnreadableImage, image_data_url
from agent_core.media.refs import file_refs, reference
from agent_core.media.tools import SendFileTool, ViewAttachmentTool
from agent_core.media.vision import BLIND_NOTE
from agent_core.tools.base import ToolContext, ToolError, ToolRegistry
from gateway.contracts.errors import FileGone
from gateway.contracts.history import ChatMessage, Role, SessionInfo
from gateway.contracts.ids import SessionId, SessionKey, UserId
from gateway.contracts.messages import Attachment
from tests.unit.agent.fakes import ScriptedProvider, answer, call, use_tools

NOW = datetime(2026, 11, 26, 12, 0, tzinfo=UTC)
BUDGET = VisionSettings().max_decoded


def session(key: str = "test:bot:ann") -> SessionInfo:
    return SessionInfo(
        id=SessionId(1),
        key=SessionKey(key),
        epoch=0,
        platform="test",
        user_id=UserId("u_ann"),
        busy_mode=None,
        user_snapshot="",
        memory_snapshot="",
        created_at=NOW,
        updated_at=NOW,
        message_count=0,
    )


def save_picture(path: Path, size: tuple[int, int], fmt: str = "PNG", mode: str = "RGB") -> Path:
    Image.new(mode, size).save(path, fmt)
    return path


def decoded(url: str) -> Image.Image:
    head, _, data = url.partition(",")
    assert head.startswith("data:image/")
    return Image.open(io.BytesIO(base64.b64decode(data)))


class Files:
    """`SessionFiles` of a dict: session key → attachments."""

    def __init__(self, by_key: dict[str, list[Attachment]]) -> None:
        self.by_key = by_key

    async def received(self, session: SessionInfo) -> Sequence[Attachment]:
        return self.by_key.get(str(session.key), [])

    async def local(self, attachment: Attachment) -> Path:
        if not await asyncio.to_thread(attachment.path.is_file):
            raise FileGone("no longer kept")
        return attachment.path

    async def keep(self, path: Path, filename: str, mime_type: str) -> Attachment:
        """Kept beside the staged file (the blob store's stand-in), which goes."""
        kept = path.with_name(f"kept-{path.name}")
        await asyncio.to_thread(path.replace, kept)
        data = await asyncio.to_thread(kept.read_bytes)
        return Attachment(kept, mime_type, len(data), filename, blob=sha256(data).hexdigest())


def attached(path: Path, mime: str = "image/png") -> Attachment:
    return Attachment(path, mime, path.stat().st_size, path.name)


# -- pictures ---------------------------------------------------------------------------------


def test_small_png_is_sent_as_it_is(tmp_path: Path) -> None:
    path = save_picture(tmp_path / "a.png", (20, 10))
    url = image_data_url(path, 10_000, max_decoded=BUDGET)
    assert url == "data:image/png;base64," + base64.b64encode(path.read_bytes()).decode()


def test_large_picture_is_scaled_down_keeping_its_shape(tmp_path: Path) -> None:
    path = save_picture(tmp_path / "a.jpg", (800, 400), "JPEG")
    image = decoded(image_data_url(path, 20_000, max_decoded=BUDGET))
    assert image.width * image.height <= 20_000
    assert image.width == 2 * image.height


def test_other_formats_are_converted_and_transparency_kept(tmp_path: Path) -> None:
    bmp = save_picture(tmp_path / "a.bmp", (30, 30), "BMP")
    assert image_data_url(bmp, 10_000, max_decoded=BUDGET).startswith("data:image/jpeg;base64,")
    tiff = save_picture(tmp_path / "a.tiff", (30, 30), "TIFF", mode="RGBA")
    assert image_data_url(tiff, 10_000, max_decoded=BUDGET).startswith("data:image/png;base64,")


def test_a_file_that_is_no_picture_is_unreadable(tmp_path: Path) -> None:
    path = tmp_path / "fake.png"
    path.write_bytes(b"not a picture")
    with pytest.raises(UnreadableImage):
        image_data_url(path, 10_000, max_decoded=BUDGET)
    with pytest.raises(UnreadableImage):
        image_data_url(tmp_path / "gone.png", 10_000, max_decoded=BUDGET)


def test_a_decompression_bomb_is_refused_unread(tmp_path: Path) -> None:
    def chunk(kind: bytes, data: bytes) -> bytes:
        body = kind + data
        return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))

    header = struct.pack(">IIBBBBB", 30_000, 30_000, 8, 2, 0, 0, 0)
    path = tmp_path / "bomb.png"
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IEND", b""))
    with pytest.raises(ImageTooLarge, match=r"too large to look at: .*DecompressionBomb"):
        image_data_url(path, 10_000, max_decoded=BUDGET)


def png_header(width: int, height: int, color_type: int = 6) -> bytes:
    """A PNG of that size with no pixel data at all (decoding it would fail)."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        body = kind + data
        return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))

    header = struct.pack(">IIBBBBB", width, height, 8, color_type, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IEND", b"")


def test_a_picture_over_the_pixel_budget_is_refused_from_its_header(tmp_path: Path) -> None:
    # 9400x9400 RGBA is under Pillow's bomb limit but decodes to 353 MB. The file holds no
    # pixel data: had it been decoded, the error would say it cannot be read.
    path = tmp_path / "huge.png"
    path.write_bytes(png_header(9400, 9400))
    for source in (path, path.read_bytes()):
        with pytest.raises(ImageTooLarge, match=r"too large to look at: 9400×9400 pixels"):
            image_data_url(source, 10_000, max_decoded=BUDGET)
    assert isinstance(ImageTooLarge("x"), UnreadableImage)  # every caller's note covers it


def test_a_jpeg_is_judged_at_the_scale_it_decodes_at(tmp_path: Path) -> None:
    # 4.8 million pixels in the header, but decoded at 1/8 scale for a 10,000-pixel view.
    jpeg = save_picture(tmp_path / "big.jpg", (2400, 2000), "JPEG")
    image = decoded(image_data_url(jpeg, 10_000, max_decoded=1_000_000))
    assert image.width * image.height <= 10_000
    png = save_picture(tmp_path / "big.png", (2400, 2000))
    with pytest.raises(ImageTooLarge):
        image_data_url(png, 10_000, max_decoded=1_000_000)


def test_a_progressive_jpeg_counts_what_its_decoder_keeps(tmp_path: Path) -> None:
    # A progressive JPEG's decoder holds every coefficient of the full-size picture (2 bytes
    # per component and pixel at 4:4:4: 1.5 four-byte pixels each), however small the scale.
    picture = Image.new("RGB", (2000, 1000), (200, 40, 90))
    baseline, progressive = tmp_path / "baseline.jpg", tmp_path / "progressive.jpg"
    picture.save(baseline, "JPEG", subsampling=0)
    picture.save(progressive, "JPEG", subsampling=0, progressive=True)
    assert decoded(image_data_url(baseline, 10_000, max_decoded=2_500_000)).size == (141, 70)
    with pytest.raises(ImageTooLarge, match=r"2000×1000 pixels \(a progressive JPEG"):
        image_data_url(progressive, 10_000, max_decoded=2_500_000)
    assert decoded(image_data_url(progressive, 10_000, max_decoded=3_100_000)).width == 141


def test_decoders_that_cost_more_are_counted_and_rare_formats_not_read(tmp_path: Path) -> None:
    # Pillow's WebP decoder holds about four times the picture while decoding.
    webp = save_picture(tmp_path / "a.webp", (2000, 1000), "WEBP")
    with pytest.raises(ImageTooLarge, match=r"2000×1000 pixels \(WEBP takes 4 times"):
        image_data_url(webp, 10_000, max_decoded=5_000_000)
    assert decoded(image_data_url(webp, 10_000, max_decoded=8_000_000)).width == 141
    # JPEG 2000 (like EPS, which Pillow hands to Ghostscript) is not read at all.
    jp2 = save_picture(tmp_path / "a.jp2", (30, 30), "JPEG2000")
    with pytest.raises(UnreadableImage, match="not a picture that can be shown"):
        image_data_url(jp2, 10_000, max_decoded=BUDGET)


def test_shrinking_keeps_colours_transparency_and_turns_upright(tmp_path: Path) -> None:
    # A transparent left half, a blue right half; shrunk by 7.3 (strips of whole boxes, then
    # resampled), it stays half transparent, half blue.
    full = Image.new("RGBA", (2190, 730), (0, 0, 0, 0))
    full.paste((0, 0, 255, 255), (1095, 0, 2190, 730))
    path = tmp_path / "half.png"
    full.save(path)
    image = decoded(image_data_url(path, 30_000, max_decoded=BUDGET))
    assert image.format == "PNG"
    assert image.mode == "RGBA"
    assert image.width * image.height <= 30_000
    assert image.width == pytest.approx(3 * image.height, abs=2)
    assert image.getpixel((2, image.height // 2)) == (0, 0, 0, 0)
    assert image.getpixel((image.width - 3, 2)) == (0, 0, 255, 255)
    # A camera held sideways (EXIF orientation 6): 300x100 as stored, 100x300 upright.
    sideways = Image.new("RGB", (300, 100), (250, 0, 0))
    exif = sideways.getexif()
    exif[0x0112] = 6
    turned = tmp_path / "turned.jpg"
    sideways.save(turned, "JPEG", exif=exif)
    assert decoded(image_data_url(turned, 10_000, max_decoded=BUDGET)).size == (57, 173)


def test_the_budget_is_checked_once_in_config() -> None:
    assert MediaConfig().max_image_pixels == VisionSettings().max_decoded == 32_000_000
    for bad in (999_999, 90_000_000):  # decoding nothing; past Pillow's own limit
        with pytest.raises(ValidationError, match="max_image_pixels"):
            MediaConfig(max_image_pixels=bad)


def test_references_round_trip(tmp_path: Path) -> None:
    a = attached(save_picture(tmp_path / "1-0-photo (1).png", (5, 5)))
    [ref] = file_refs(f"[Ann] look\n{reference(a)}")
    assert (ref.name, ref.path, ref.is_image) == (a.filename, a.path, True)


# -- the vision step --------------------------------------------------------------------------


async def test_vision_shows_only_this_turns_pictures_of_this_session(tmp_path: Path) -> None:
    mine = attached(save_picture(tmp_path / "mine.png", (10, 10)))
    old = attached(save_picture(tmp_path / "old.png", (10, 10)))
    theirs = attached(save_picture(tmp_path / "theirs.png", (10, 10)))
    files = Files({"test:bot:ann": [old, mine], "test:bot:bob": [theirs]})
    vision = Vision(VisionSettings(enabled=True, max_pixels=10_000), files)
    context = [
        ChatMessage(Role.SYSTEM, "s"),
        ChatMessage(Role.USER, f"earlier\n{reference(old)}"),
        ChatMessage(Role.ASSISTANT, "nice"),
        # A reference typed by the person to someone else's file is not a file of theirs.
        ChatMessage(Role.USER, f"now\n{reference(mine)}\n{reference(theirs)}"),
    ]
    shown = await vision.show(session(), context)
    assert [len(m.images) for m in shown] == [0, 0, 0, 1]
    assert shown[3].to_openai()["content"][1]["type"] == "image_url"


async def test_without_vision_the_model_is_told_it_cannot_see(tmp_path: Path) -> None:
    mine = attached(save_picture(tmp_path / "mine.png", (10, 10)))
    vision = Vision(VisionSettings(enabled=False), Files({"test:bot:ann": [mine]}))
    [message] = await vision.show(session(), [ChatMessage(Role.USER, reference(mine))])
    assert message.images == ()
    assert message.content.endswith(BLIND_NOTE)


async def test_at_most_max_images_per_turn(tmp_path: Path) -> None:
    pics = [attached(save_picture(tmp_path / f"{i}.png", (10, 10))) for i in range(3)]
    vision = Vision(VisionSettings(enabled=True, max_per_turn=2), Files({"test:bot:ann": pics}))
    text = "\n".join(reference(p) for p in pics)
    [message] = await vision.show(session(), [ChatMessage(Role.USER, text)])
    assert len(message.images) == 2
    assert "[picture 2.png not shown: more than 2 pictures this turn" in message.content


# -- view_attachment ----------------------------------------------------------------------------


async def test_view_attachment_shows_the_picture_in_the_next_model_call(tmp_path: Path) -> None:
    mine = attached(save_picture(tmp_path / "mine.png", (10, 10)))
    theirs = attached(save_picture(tmp_path / "theirs.png", (10, 10)))
    files = Files({"test:bot:ann": [mine], "test:bot:bob": [theirs]})
    tools = ToolRegistry([ViewAttachmentTool(files, VisionSettings(enabled=True))])
    provider = ScriptedProvider(
        use_tools(call("c1", "view_attachment", {"file": "theirs.png"})),
        use_tools(call("c2", "view_attachment", {"file": "mine.png"})),
        answer("I see it"),
    )
    progress = TurnProgress()
    ctx = ToolContext(session=session(), user_id=None, media=TurnMedia())
    await run_tool_loop(provider, [], tools, ctx, progress, max_iterations=4)
    refused, shown = (m for m in progress.messages if m.role is Role.TOOL)
    assert refused.content.startswith("error: no file 'theirs.png' was sent in this conversation")
    assert "follows as a picture" in shown.content
    last = provider.calls[-1].messages
    assert last[-1].role is Role.USER
    assert len(last[-1].images) == 1


async def test_view_attachment_without_vision_says_so(tmp_path: Path) -> None:
    mine = attached(save_picture(tmp_path / "mine.png", (10, 10)))
    tool = ViewAttachmentTool(Files({"test:bot:ann": [mine]}), VisionSettings(enabled=False))
    ctx = ToolContext(session=session(), user_id=None, media=TurnMedia())
    with pytest.raises(ToolError, match="cannot see pictures"):
        await tool({"file": "mine.png"}, ctx)


async def test_a_picture_over_the_budget_is_a_note_and_view_attachment_refuses_it(
    tmp_path: Path,
) -> None:
    path = tmp_path / "huge.png"
    path.write_bytes(png_header(9400, 9400))
    huge = attached(path)
    files = Files({"test:bot:ann": [huge]})
    settings = VisionSettings(enabled=True)
    [message] = await Vision(settings, files).show(
        session(), [ChatMessage(Role.USER, reference(huge))]
    )
    assert message.images == ()
    assert "[picture huge.png (image/png) not shown: too large to look at: 9400×9400" in (
        message.content
    )
    ctx = ToolContext(session=session(), user_id=None, media=TurnMedia())
    with pytest.raises(ToolError, match=r"huge\.png cannot be shown: too large to look at"):
        await ViewAttachmentTool(files, settings)({"file": "huge.png"}, ctx)


# -- send_file ------------------------------------------------------------------------------------


class Targets:
    """This chat takes `limit` bytes; `other` is the one other allowed target."""

    def __init__(self, limit: int) -> None:
        self.limit = limit

    def max_bytes_here(self, ctx: ToolContext) -> int:
        return self.limit

    async def resolve(self, target: str, ctx: ToolContext) -> Destination:
        if target != "other":
            raise ToolError(f"unknown target {target!r}")
        return Destination("test", "bot", "other-chat", None, self.limit)


def send_tool(tmp_path: Path, limit: int = 1000, files: Files | None = None) -> SendFileTool:
    (tmp_path / "work").mkdir(exist_ok=True)
    return SendFileTool(
        Targets(limit),
        files or Files({}),
        roots=[tmp_path / "work"],
        staging=tmp_path / "outbox",
    )


async def test_send_file_queues_a_staged_copy(tmp_path: Path) -> None:
    tool = send_tool(tmp_path)
    (tmp_path / "work" / "chart.png").write_bytes(b"png!")
    media = TurnMedia()
    ctx = ToolContext(session=session(), user_id=None, media=media)
    said = await tool({"path": "chart.png", "caption": "your chart"}, ctx)
    await tool({"content": "a,b\n1,2\n", "filename": "../../data.csv", "target": "other"}, ctx)
    assert "chart.png (4 bytes) will be sent to this chat" in said
    first, second = media.files
    assert first.attachment.path.parent == tmp_path / "outbox"
    assert first.attachment.path.read_bytes() == b"png!"
    assert (first.caption, first.to, first.attachment.mime_type) == (
        "your chart",
        None,
        "image/png",
    )
    assert second.attachment.filename == "data.csv"  # never a path
    assert second.to is not None
    assert second.to.chat_id == "other-chat"


@pytest.mark.parametrize("path", ["/etc/passwd", "../secret.txt", "missing.txt"])
async def test_send_file_refuses_files_outside_its_folders(tmp_path: Path, path: str) -> None:
    (tmp_path / "secret.txt").write_text("no")
    ctx = ToolContext(session=session(), user_id=None, media=TurnMedia())
    with pytest.raises(ToolError, match="is not a file I may send"):
        await send_tool(tmp_path)({"path": path}, ctx)
    assert ctx.media is not None
    assert ctx.media.files == []


async def test_send_file_may_send_back_what_this_person_sent(tmp_path: Path) -> None:
    mine = attached(save_picture(tmp_path / "mine.png", (10, 10)))
    tool = send_tool(tmp_path, files=Files({"test:bot:ann": [mine]}))
    media = TurnMedia()
    await tool({"path": "mine.png"}, ToolContext(session=session(), user_id=None, media=media))
    assert media.files[0].attachment.filename == "mine.png"
    other = ToolContext(session=session("test:bot:bob"), user_id=None, media=TurnMedia())
    with pytest.raises(ToolError):
        await tool({"path": str(mine.path)}, other)


async def test_send_file_over_the_platform_limit_is_a_clear_error(tmp_path: Path) -> None:
    ctx = ToolContext(session=session(), user_id=None, media=TurnMedia())
    with pytest.raises(ToolError, match="takes files of at most 10 bytes"):
        await send_tool(tmp_path, limit=10)({"content": "x" * 11, "filename": "a.txt"}, ctx)
    with pytest.raises(ToolError, match="unknown target"):
        await send_tool(tmp_path)({"content": "x", "filename": "a.txt", "target": "nope"}, ctx)
    no_chat = ToolContext(session=session(), user_id=None)
    with pytest.raises(ToolError, match="chat conversation"):
        await send_tool(tmp_path)({"content": "x", "filename": "a.txt"}, no_chat)


async def test_in_a_job_run_a_file_goes_to_the_report_chats_within_each_limit(
    tmp_path: Path,
) -> None:
    """A scheduled job's run has no chat: files go where its report goes, each chat's
    platform limit checked (chats that take no files are left out), none without a chat."""
    job = session("cron:default:digest")
    report_to = (
        Destination("telegram", "bot", "42", None, 100),
        Destination("sms", "acct", "+15550100", None, 0),  # takes no files
        Destination("slack", "team", "C1", "t1", 10),
    )
    media = TurnMedia(report_to=report_to)
    ctx = ToolContext(session=job, user_id=None, media=media)
    tool = send_tool(tmp_path)
    with pytest.raises(ToolError, match="slack takes files of at most 10 bytes"):
        await tool({"content": "x" * 11, "filename": "a.txt"}, ctx)
    said = await tool({"content": "x" * 10, "filename": "a.txt"}, ctx)
    assert said == "a.txt (10 bytes) will be sent after your report, to telegram:42, slack:C1:t1."
    assert [f.to for f in media.files] == [None]
    sms_only = ToolContext(session=job, user_id=None, media=TurnMedia(report_to=report_to[1:2]))
    with pytest.raises(ToolError, match=r"reports to \(sms:\+15550100\) take no files"):
        await tool({"content": "x", "filename": "a.txt"}, sms_only)
    nowhere = ToolContext(session=job, user_id=None, media=TurnMedia(report_to=()))
    with pytest.raises(ToolError, match="no chat to report to"):
        await tool({"content": "x", "filename": "a.txt"}, nowhere)
