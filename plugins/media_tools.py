"""Built-in plugin: ``send_file``, a file from the user's workspace delivered to the chat.

The file is opened once below ``context.workspace`` like every file tool's
(:class:`workspaces.root.WorkspaceRoot`: no link followed at open), and the
channel uploads from that descriptor (:attr:`~roost.OutboundFile.source`),
never reopening the path, so nothing outside the workspace can be sent. The file goes out at
once through :attr:`~roost.ToolContext.send` as an
:class:`~roost.OutboundMessage` carrying an :class:`~roost.OutboundFile`; the
channel uploads it (a photo or a document, as the platform allows). Failures
raise :class:`~roost.ToolError` with one of these codes: ``INVALID_ARGUMENT``,
``INVALID_PATH``, ``PATH_ESCAPE``, ``NOT_FOUND``, ``IS_A_DIRECTORY``,
``NOT_A_FILE``, ``EMPTY_FILE``, ``TOO_LARGE`` (over the platform's upload
limit), ``UNAVAILABLE`` (no chat to send to), ``SEND_FAILED``.
"""

from __future__ import annotations

import asyncio
import logging
import os
import stat
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from roost import (
    MediaError,
    MediaTooLarge,
    OpenFile,
    OutboundFile,
    OutboundMessage,
    Settings,
    Tool,
    ToolContext,
    ToolError,
    ToolRetry,
    WorkspaceRoot,
    check_keys,
    hookimpl,
    sniff_mime,
    str_arg,
)

__all__ = ["roost_tools"]

log = logging.getLogger("roost.plugins.media_tools")

MAX_CAPTION = 1000
"""Characters of caption kept (Telegram allows 1024 in a caption, the tightest platform)."""

_SNIFF_BYTES = 8192


@hookimpl
def roost_tools(settings: Settings) -> list[Tool]:
    """The ``send_file`` tool."""

    async def send_file(context: ToolContext, args: Mapping[str, Any]) -> str:
        check_keys(args, required=("path",), optional=("caption",))
        path = str_arg(args, "path")
        caption = str_arg(args, "caption", default="").strip()
        if len(caption) > MAX_CAPTION:
            raise ToolError(
                f"the caption is {len(caption)} characters; at most {MAX_CAPTION} fit under "
                "a file: shorten it, or send the text as your reply",
                code="INVALID_ARGUMENT",
            )
        opened, shown, head = await asyncio.to_thread(_open, context.workspace, path)
        size = opened.size
        try:
            if context.send is None:
                raise ToolError("this run has no chat to send files to", code="UNAVAILABLE")
            name = shown.rsplit("/", 1)[-1]
            mime = sniff_mime(head, name=name)
            message = OutboundMessage(
                channel=context.channel,
                chat_id=context.chat_id,
                text="",
                chat_type="group" if context.chat_type == "group" else "direct",
                thread_id=context.thread_id,
                files=(OutboundFile(os.path.join(context.workspace, shown), name, mime, size,
                                    caption, source=opened),),
            )
            await _send(context, message, shown, size)
        finally:
            opened.close()
        return f"Sent {shown} ({_size(size)}, {mime}) to the chat."

    return [
        Tool(
            name="send_file",
            description=(
                "Send a workspace file to this chat (images as photos, others as files), "
                "with an optional caption. Platforms cap the size."
            ),
            input_schema={
                "type": "object",
                "properties": {
                    "path": {
                        "type": "string",
                        "description": "Workspace path, e.g. charts/sales.png",
                    },
                    "caption": {
                        "type": "string",
                        "description": "Text shown with the file",
                    },
                },
                "required": ["path"],
                "additionalProperties": False,
            },
            execute=send_file,
            # An upload that failed midway may still have reached the chat:
            # never sent twice by a retry (the channel retries what is safe).
            retry=ToolRetry(max_attempts=1),
            permanent_codes=frozenset({"TOO_LARGE", "SEND_FAILED", "UNAVAILABLE"}),
        )
    ]


async def _send(context: ToolContext, message: OutboundMessage, shown: str, size: int) -> None:
    """Hand ``message`` to the chat; what went wrong as a :class:`ToolError`."""
    assert context.send is not None
    try:
        await context.send(message)
    except MediaTooLarge as exc:
        limit = f"; {context.channel} takes files up to {_size(exc.limit)}" if exc.limit \
            else f"; {context.channel} refused it as too large"
        raise ToolError(
            f"{shown} is {_size(size)}, too large to send{limit}. Send a smaller file "
            "(compress or split it) or tell the user where it is",
            code="TOO_LARGE", details={"size": size, "limit": exc.limit},
        ) from exc
    except MediaError as exc:
        raise ToolError(f"{shown} could not be sent: {exc}", code="SEND_FAILED") from exc
    except LookupError as exc:
        raise ToolError(f"{shown} could not be sent: {exc}", code="UNAVAILABLE") from exc
    # The channel retried what was transient; anything else it raised means not
    # delivered, and the model must read that rather than the run failing.
    except Exception as exc:
        log.warning("send_file: %s could not be sent to %s: %s", shown, context.channel, exc)
        raise ToolError(f"{shown} could not be sent: {type(exc).__name__}",
                        code="SEND_FAILED") from exc


def _open(workspace: Path, path: str) -> tuple[OpenFile, str, bytes]:
    """Open ``path`` once below ``workspace``: the file, its shown path, its first bytes.

    A :class:`ToolError` unless it is a non-empty regular file. The upload reads
    from this descriptor; the path is never opened again.
    """
    with WorkspaceRoot(workspace) as root:
        try:
            fd, parts = root.open(path)
        except FileNotFoundError:
            raise ToolError(f"{path!r} does not exist", code="NOT_FOUND") from None
        except NotADirectoryError:
            raise ToolError(f"{path!r} does not exist (a parent is a file)",
                            code="NOT_FOUND") from None
        except OSError as exc:
            raise ToolError(f"{path!r}: {exc.strerror or exc}", code="SEND_FAILED") from exc
    try:
        info = os.fstat(fd)
        if stat.S_ISDIR(info.st_mode):
            raise ToolError(f"{path!r} is a directory; send the files in it one by one",
                            code="IS_A_DIRECTORY")
        if not stat.S_ISREG(info.st_mode):
            raise ToolError(f"{path!r} is not a regular file", code="NOT_A_FILE")
        if info.st_size == 0:
            raise ToolError(f"{path!r} is empty; there is nothing to send", code="EMPTY_FILE")
        opened = OpenFile(fd)
        head = opened.read_at(0, _SNIFF_BYTES)
    except OSError as exc:
        os.close(fd)
        raise ToolError(f"{path!r}: {exc.strerror or exc}", code="SEND_FAILED") from exc
    except BaseException:
        os.close(fd)
        raise
    return opened, "/".join(parts), head


def _size(size: int) -> str:
    if size >= 1024 * 1024:
        return f"{size / (1024 * 1024):.1f} MB"
    if size >= 1024:
        return f"{size // 1024} KB"
    return f"{size} bytes"
