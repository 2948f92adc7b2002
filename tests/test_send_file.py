"""send_file: a workspace file reaches the chat, through a whole run of the app."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from bot.contracts.media import MediaError, MediaTooLarge
from bot.contracts.messages import OutboundMessage
from bot.contracts.tools import ToolContext, ToolError
from bot.testing.app import ChatChannel
from plugins import media_tools
from roost import Settings
from tests.media_samples import png
from workspaces import workspace_dir

AppFactory = Callable[..., Any]


def sending(path: str, caption: str | None = None) -> list[dict[str, Any]]:
    """A script where the model calls send_file once, then says "done"."""
    arguments: dict[str, Any] = {"path": path}
    if caption is not None:
        arguments["caption"] = caption
    return [{"steps": [{"tool_calls": [{"name": "send_file", "arguments": arguments}]},
                       {"reply": "done"}]}]


def workspace(chat: ChatChannel, user: str = "user") -> Path:
    assert chat.app is not None
    path = workspace_dir(chat.app.settings.workspaces_dir, chat.name, user)
    path.mkdir(parents=True, exist_ok=True)
    return path


def with_files(chat: ChatChannel) -> list[OutboundMessage]:
    return [m for m in chat.sent if m.files]


async def test_a_workspace_file_is_delivered_to_the_chat_with_its_caption(
    roost_app: AppFactory,
) -> None:
    chat = await roost_app(sending("charts/sales.png", "Sales by month"))
    chart = workspace(chat) / "charts" / "sales.png"
    chart.parent.mkdir()
    chart.write_bytes(png(300, 200))

    replies = await chat.ask("send me the chart")

    assert replies[-1] == "done"
    [message] = with_files(chat)
    assert (message.channel, message.chat_id, message.chat_type) == ("console", "user", "direct")
    [sent] = message.files
    assert Path(sent.path) == chart.resolve()
    assert (sent.name, sent.mime_type, sent.size, sent.caption) == (
        "sales.png", "image/png", chart.stat().st_size, "Sales by month")
    assert chat.tool_results("send_file") == [
        f"Sent charts/sales.png ({chart.stat().st_size} bytes, image/png) to the chat."]


async def test_in_a_group_thread_the_file_goes_to_that_thread(roost_app: AppFactory) -> None:
    chat = await roost_app(sending("report.pdf"))
    (workspace(chat, "ann") / "report.pdf").write_bytes(b"%PDF-1.4\n%%EOF\n")

    await chat.ask("send the report", sender="ann", group="g1", thread="t9")

    [message] = with_files(chat)
    assert (message.chat_id, message.chat_type, message.thread_id) == ("g1", "group", "t9")
    assert message.files[0].mime_type == "application/pdf"


@pytest.mark.parametrize(("path", "code"), [
    ("../../../../etc/passwd", "PATH_ESCAPE"),
    ("/etc/passwd", "INVALID_PATH"),
    ("~/secret", "INVALID_PATH"),
    ("link/secret.txt", "PATH_ESCAPE"),
])
async def test_a_path_outside_the_workspace_is_refused_and_nothing_is_sent(
    roost_app: AppFactory, tmp_path: Path, path: str, code: str
) -> None:
    chat = await roost_app(sending(path))
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text("top secret")
    os.symlink(outside, workspace(chat) / "link")

    replies = await chat.ask("send it")

    assert replies[-1] == "done"
    assert with_files(chat) == []
    [result] = chat.tool_results("send_file")
    assert code in result
    assert "top secret" not in result


@pytest.mark.parametrize(("make", "expected"), [
    (None, "'missing.png' does not exist"),
    ("dir", "'missing.png' is a directory"),
    ("empty", "'missing.png' is empty"),
])
async def test_a_missing_directory_or_empty_path_is_reported_to_the_model(
    roost_app: AppFactory, make: str | None, expected: str
) -> None:
    chat = await roost_app(sending("missing.png"))
    target = workspace(chat) / "missing.png"
    if make == "dir":
        target.mkdir()
    elif make == "empty":
        target.write_bytes(b"")

    await chat.ask("send it")

    assert with_files(chat) == []
    [result] = chat.tool_results("send_file")
    assert expected in result


async def test_a_file_over_the_platform_limit_comes_back_as_a_clear_error(
    roost_app: AppFactory,
) -> None:
    chat = await roost_app(sending("video.mp4"))
    video = workspace(chat) / "video.mp4"
    video.write_bytes(b"\x00\x00\x00\x18ftypmp42" + bytes(3 * 1024 * 1024))
    attempts: list[OutboundMessage] = []
    record = chat.send

    async def limited(message: OutboundMessage) -> None:
        if message.files:
            attempts.append(message)
            raise MediaTooLarge(message.files[0].size, 2 * 1024 * 1024)
        await record(message)

    chat.send = limited  # type: ignore[method-assign]

    replies = await chat.ask("send the video")

    assert replies[-1] == "done"
    assert len(attempts) == 1  # not retried: an upload is never sent twice
    [result] = chat.tool_results("send_file")
    assert "TOO_LARGE" in result
    assert "video.mp4 is 3.0 MB, too large to send; console takes files up to 2.0 MB" in result


async def test_a_failed_upload_is_reported_once_and_not_retried(roost_app: AppFactory) -> None:
    chat = await roost_app(sending("a.png"))
    (workspace(chat) / "a.png").write_bytes(png(5, 5))
    calls = 0
    record = chat.send

    async def broken(message: OutboundMessage) -> None:
        nonlocal calls
        if not message.files:
            return await record(message)
        calls += 1
        raise MediaError("the platform refused the upload")

    chat.send = broken  # type: ignore[method-assign]

    await chat.ask("send it")

    assert calls == 1
    [result] = chat.tool_results("send_file")
    assert "a.png could not be sent: the platform refused the upload" in result


async def test_without_a_way_to_send_the_tool_says_so(tmp_path: Path) -> None:
    [tool] = media_tools.roost_tools(Settings(data_dir=tmp_path))
    (tmp_path / "a.png").write_bytes(png(5, 5))
    context = ToolContext("u", "console", "u", "k", "r", tmp_path, time.monotonic() + 30)

    with pytest.raises(ToolError) as caught:
        await tool.execute(context, {"path": "a.png"})

    assert caught.value.code == "UNAVAILABLE"


async def test_a_caption_too_long_for_any_platform_is_refused(tmp_path: Path) -> None:
    [tool] = media_tools.roost_tools(Settings(data_dir=tmp_path))
    (tmp_path / "a.png").write_bytes(png(5, 5))
    sent: list[OutboundMessage] = []

    async def send(message: OutboundMessage) -> None:
        sent.append(message)

    context = ToolContext("u", "console", "u", "k", "r", tmp_path, time.monotonic() + 30,
                          send=send)

    with pytest.raises(ToolError) as caught:
        await tool.execute(context, {"path": "a.png", "caption": "x" * 1001})

    assert caught.value.code == "INVALID_ARGUMENT"
    assert sent == []
