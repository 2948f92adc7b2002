"""Files: ``files`` on messages in (and their bytes with the bot token) and uploads out.

Inbound, each file object of a message event becomes an :class:`Attachment`
whose ``url`` is its ``url_private_download`` (else ``url_private``; for a
minimal object without either, as Slack Connect sends with ``file_access:
check_file_info``, ``slack-file:<id>``, and the link comes from ``files.info``).
:meth:`Media.download` GETs it with ``Authorization: Bearer <bot token>``,
which needs the ``files:read`` scope. The token goes only to Slack's own hosts
(``slack.com`` and its subdomains, over https) or to the host of
``SLACK_API_BASE``; a link elsewhere is refused unread. Slack answers a
request it will not authorize with a redirect to its login page (or a 403),
never with the file: that is reported as the missing scope.

Outbound, each file of a reply is uploaded after its text with slack_sdk's
``files_upload_v2`` (``files.getUploadURLExternal``, the upload, then
``files.completeUploadExternal`` sharing it into the channel and thread, the
caption as its comment), which needs ``files:write``. Slack takes files up to
1 GB; a larger one raises :class:`MediaTooLarge` before anything is posted.
An upload is tried once: the API has no idempotency key, and a retry after a
lost answer would share the file twice.
"""

from __future__ import annotations

import asyncio
import re
import urllib.parse
from collections.abc import Sequence

import aiohttp
from slack_sdk.errors import SlackApiError, SlackRequestError

from bot.config.settings import Settings
from bot.contracts.files import OpenFile
from bot.contracts.media import MediaError, MediaTooLarge
from bot.contracts.messages import Attachment, OutboundFile, clean_text
from channels.delivery import DeliveryPolicy
from channels.fetching import fetch_capped
from channels.inflight import InFlight
from channels.logline import short as _short
from channels.slack.api import SlackApi
from channels.slack.common import RecentKeys, error_code, log
from channels.slack.errors import delivery_error
from channels.slack_format import to_mrkdwn

MAX_UPLOAD = 1024 * 1024 * 1024
"""Slack's limit on one uploaded file (1 GB)."""
DOWNLOAD_TIMEOUT = 120.0
"""Seconds one download may take, connecting included."""
FILE_INFO = "slack-file:"
"""The ``url`` of an attachment whose event carried no link (Slack Connect's
``file_access: check_file_info``): :meth:`Media.download` asks ``files.info`` first."""
_FILE_ID = re.compile(r"F[A-Z0-9]{1,63}")
_SCOPE_HINT = ("Roost lacks the files:read scope (add it to the Slack app and reinstall "
               "it)")
_MB = 1024 * 1024


class Media:
    """Downloads of ``url_private`` with the bot token, and file uploads with a reply."""

    def __init__(self, settings: Settings, api: SlackApi, inflight: InFlight,
                 bot_threads: RecentKeys[tuple[str, str]], *,
                 policy: DeliveryPolicy) -> None:
        """``bot_threads`` gets each thread a file is shared into; ``policy`` tunes the
        retries of a download."""
        self.settings = settings
        self.api = api
        self.inflight = inflight
        self.bot_threads = bot_threads
        self.policy = policy
        self._media_session: aiohttp.ClientSession | None = None

    async def download(self, attachment: Attachment, limit: int) -> bytes:
        """The bytes of ``attachment`` from Slack, at most ``limit`` of them.

        Raises :class:`MediaTooLarge` past ``limit`` (declared or read) and
        :class:`MediaError` with a one-line reason for anything else: a link
        that is not Slack's, a missing ``files:read`` scope (401, 403, or the
        redirect to the login page Slack answers with), a file gone, a 5xx or
        a connection failure that lasted through the retries of ``policy``.
        """
        name = attachment.name or "the file"
        url = attachment.url
        if url.startswith(FILE_INFO):
            url = await self._file_url(url.removeprefix(FILE_INFO), name)
        if not url:
            raise MediaError(f"Slack gave no download link for {name}")
        if not self._slack_url(url):
            raise MediaError(f"{name} does not link to Slack; not fetched with the bot token")
        session = self._media_session
        if session is None or session.closed:
            session = self._media_session = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=DOWNLOAD_TIMEOUT))

        def check(response: aiohttp.ClientResponse) -> None:
            if response.status in (301, 302, 303, 307, 308, 401, 403):
                raise MediaError(f"Slack did not hand over {name}: {_SCOPE_HINT}")
            if response.status in (404, 410):
                raise MediaError(f"Slack no longer has {name} (HTTP {response.status})")
            if response.status != 200:
                raise MediaError(f"Slack answered HTTP {response.status} for {name}")
            if (response.content_type == "text/html"
                    and not attachment.mime_type.startswith("text/html")):
                # The login page served in place of the file (a token without
                # the scope, behind some proxies without the redirect).
                raise MediaError(f"Slack sent a web page instead of {name}: {_SCOPE_HINT}")

        # No redirects: Slack redirects a request it will not authorize to its
        # login page, and the token must not follow a redirect anywhere.
        return await fetch_capped(
            session, url, limit, check=check, policy=self.policy, allow_redirects=False,
            headers={"Authorization": f"Bearer {self.api.web.token}"},
            what=f"downloading {name} from Slack")

    async def _file_url(self, file_id: str, name: str) -> str:
        """The download link ``files.info`` gives for a file the event did not describe."""
        try:
            response = await self.api.call("files.info", self.api.web.files_info, self.policy,
                                        file=file_id)
        except SlackApiError as exc:
            code = error_code(exc)
            if code == "missing_scope":
                raise MediaError(f"Slack did not describe {name}: {_SCOPE_HINT}") from exc
            raise MediaError(f"Slack did not describe {name}: "
                             f"{code or 'an unreadable answer'}") from exc
        except Exception as exc:
            raise MediaError(f"Slack did not describe {name} ({_short(exc, 120)})") from exc
        file = response.get("file")
        if not isinstance(file, dict):
            return ""
        return _text(file.get("url_private_download")) or _text(file.get("url_private"))

    def _slack_url(self, url: str) -> bool:
        """Whether ``url`` is Slack's (or the configured API host's): the token may go there."""
        parts = urllib.parse.urlsplit(url)
        host = (parts.hostname or "").lower()
        if parts.scheme == "https" and (host == "slack.com" or host.endswith(".slack.com")):
            return True
        base = self.settings.slack_api_base
        if not base:
            return False
        configured = urllib.parse.urlsplit(base)
        return (parts.scheme, parts.netloc.lower()) == (configured.scheme,
                                                        configured.netloc.lower())

    async def close(self) -> None:
        """Close the download session (a later download opens another)."""
        if self._media_session is not None:
            await self._media_session.close()
            self._media_session = None

    def check_file(self, file: OutboundFile, size: int) -> None:
        """Raise :class:`MediaTooLarge` for a file over Slack's 1 GB (its size when opened)."""
        if size > MAX_UPLOAD:
            raise MediaTooLarge(size, MAX_UPLOAD, f"{file.name} is {size / _MB:.0f} MB; "
                                "Slack takes files up to 1 GB")

    async def upload_files(self, channel: str, thread_ts: str | None,
                            files: tuple[OutboundFile, ...],
                            opened: Sequence[OpenFile]) -> None:
        """Share each file into ``channel`` (and ``thread_ts``), its caption as the comment.

        The bytes come from ``opened`` (each file opened once), never from its path.
        """
        api = self.api.web
        for file, source in zip(files, opened, strict=True):
            try:
                data = await asyncio.to_thread(source.read_all)
                response = await self.inflight.tracked(api.files_upload_v2(
                    channel=channel, thread_ts=thread_ts, file=data, filename=file.name,
                    title=file.name,
                    initial_comment=to_mrkdwn(file.caption) if file.caption else None))
            except SlackApiError as exc:
                code = error_code(exc)
                if code in ("missing_scope", "not_allowed_token_type"):
                    raise MediaError(f"Slack refused to upload {file.name}: Roost lacks the "
                                     "files:write scope") from exc
                mapped = delivery_error(exc)
                if mapped is exc:
                    raise MediaError(f"Slack refused to upload {file.name}: "
                                     f"{code or 'an unreadable answer'}") from exc
                raise mapped from exc
            except SlackRequestError as exc:  # the upload step itself failed
                raise MediaError(f"Slack did not take {file.name}: {_short(exc, 120)}") from exc
            except OSError as exc:
                raise MediaError(f"cannot read {file.name}: {exc.strerror or exc}") from exc
            except Exception as exc:
                mapped = delivery_error(exc)
                if mapped is exc:
                    raise
                raise mapped from exc
            if thread_ts:
                self.bot_threads.add((channel, thread_ts))
            shared = response.get("file")
            log.info("Slack: uploaded %s (%d bytes) to %s as %s", file.name, source.size,
                     channel, shared.get("id") if isinstance(shared, dict) else "?")


def attachments_of(event: dict[str, object]) -> tuple[Attachment, ...]:
    """The core's :class:`Attachment` items for the ``files`` of a message event.

    Slack's file objects are taken as given, so every field is type-checked
    and text is cleaned of lone surrogates (the core stores it as is).
    """
    files = event.get("files")
    if not isinstance(files, list):
        return ()
    ts = str(event.get("ts") or "")
    found = []
    for item in files:
        if not isinstance(item, dict):
            continue
        mime = _text(item.get("mimetype")).split(";", 1)[0].strip().lower()
        major = mime.split("/", 1)[0]
        if _text(item.get("subtype")) == "slack_audio":
            kind = "voice"  # a clip recorded in Slack
        elif major == "image":
            kind = "photo"
        elif major in ("audio", "video"):
            kind = major
        else:
            kind = "document" if mime else "file"
        url = _text(item.get("url_private_download")) or _text(item.get("url_private"))
        file_id = _text(item.get("id"))
        if not url and _FILE_ID.fullmatch(file_id):
            url = FILE_INFO + file_id  # a minimal file object: files.info has the link
        name = _text(item.get("name")) or f"{kind}-{ts.replace('.', '-') or 'slack'}"
        duration_ms = _count(item.get("duration_ms"))
        found.append(Attachment(
            kind=kind, name=name, url=url, mime_type=mime, size=_count(item.get("size")),
            width=_count(item.get("original_w")), height=_count(item.get("original_h")),
            duration=duration_ms / 1000))
    return tuple(found)


def _text(value: object) -> str:
    return clean_text(value) if isinstance(value, str) else ""


def _count(value: object) -> int:
    return value if type(value) is int and value >= 0 else 0
