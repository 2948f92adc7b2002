"""A real Synapse homeserver for the Matrix channel's tests, and real matrix-nio users on it.

Synapse lives in its own venv (``.venv-synapse``, which scripts/check installs in the
background while the static checks run; its pins stay out of Roost's). :func:`start`
writes a config (SQLite, loopback, fast password hashing, rate limits raised so tests
never hit them unless a test asks for it per user) and waits until the client API
answers. Users are registered through the admin API with the shared secret.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import hmac
import itertools
import os
import secrets
import socket
import subprocess
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import aiohttp.web
import nio
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
VENV = Path(os.environ.get("ROOST_SYNAPSE_VENV", ROOT / ".venv-synapse"))
STATUS = VENV.parent / (VENV.name + ".status")
"""Written by scripts/check: ``installing`` while its background install of Synapse runs,
then ``ok`` or why not."""
INSTALL = ("uv venv .venv-synapse && uv pip install -p .venv-synapse/bin/python "
           "matrix-synapse && echo ok > .venv-synapse.status")
LOOSE = {"per_second": 10_000, "burst_count": 10_000}
_names = itertools.count(1)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _python() -> Path:
    """Synapse's interpreter, once scripts/check's background install finished; fails
    loudly (never skips) when there is none."""
    python = VENV / "bin" / "python"
    deadline = time.monotonic() + 900  # a hang guard: the install takes about a minute
    while STATUS.exists() and STATUS.read_text().strip() in ("installing", ""):
        if time.monotonic() > deadline:
            pytest.fail("the background install of Synapse did not finish in 15 minutes")
        time.sleep(0.2)
    if STATUS.exists() and STATUS.read_text().strip() != "ok":
        log = VENV.parent / (VENV.name + ".log")
        tail = log.read_text(errors="replace")[-2000:] if log.exists() else ""
        pytest.fail(f"installing Synapse {STATUS.read_text().strip()}\n{tail}")
    if not python.exists():
        pytest.fail(f"no Synapse at {VENV}: scripts/check installs it; by hand: {INSTALL}")
    return python


@dataclass
class Synapse:
    """One running homeserver (see the module docstring)."""

    directory: Path
    port: int
    secret: str
    proc: subprocess.Popen[bytes]
    admin_token: str = ""
    started_in: float = 0.0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def log_tail(self) -> str:
        path = self.directory / "synapse.log"
        return path.read_text(errors="replace")[-3000:] if path.exists() else ""

    async def register(self, name: str | None = None, *, admin: bool = False,
                       displayname: str | None = None) -> User:
        """A new user (a unique name unless given), logged in with a device of its own."""
        name = name or f"u{next(_names)}x{secrets.token_hex(3)}"
        password = secrets.token_hex(8)
        async with aiohttp.ClientSession() as session:
            url = f"{self.url}/_synapse/admin/v1/register"
            async with session.get(url) as response:
                nonce = (await response.json())["nonce"]
            mac = hmac.new(self.secret.encode(), digestmod=hashlib.sha1)
            mac.update(b"\x00".join([nonce.encode(), name.encode(), password.encode(),
                                     b"admin" if admin else b"notadmin"]))
            body = {"nonce": nonce, "username": name, "password": password, "admin": admin,
                    "mac": mac.hexdigest()}
            async with session.post(url, json=body) as response:
                data = await response.json()
                assert response.status == 200, data
        user = User(self, data["user_id"], password, data["access_token"], data["device_id"])
        if displayname:
            await user.client.set_displayname(displayname)
        return user

    async def admin(self) -> str:
        """An admin's access token (registered on first use)."""
        if not self.admin_token:
            self.admin_token = (await self.register(admin=True)).token
        return self.admin_token

    async def limit_messages(self, user_id: str, per_second: float, burst: int) -> None:
        """Rate-limit ``user_id``'s messages as Synapse's ``rc_message`` would (the admin
        API's per-user override): the next burst gets real 429 ``M_LIMIT_EXCEEDED``."""
        token = await self.admin()
        async with aiohttp.ClientSession() as session, session.post(
                f"{self.url}/_synapse/admin/v1/users/{user_id}/override_ratelimit",
                json={"messages_per_second": per_second, "burst_count": burst},
                headers={"Authorization": f"Bearer {token}"}) as response:
            assert response.status == 200, await response.text()


@dataclass
class User:
    """A person on the homeserver, through a real matrix-nio client."""

    server: Synapse
    user_id: str
    password: str
    token: str
    device_id: str
    client: Any = field(init=False)
    since: str | None = None

    def __post_init__(self) -> None:
        self.client = nio.AsyncClient(self.server.url, self.user_id)
        self.client.restore_login(self.user_id, self.device_id, self.token)

    async def close(self) -> None:
        await self.client.close()

    async def dm(self, other: str) -> str:
        """A new direct room with ``other`` invited; its id."""
        answer = await self.client.room_create(is_direct=True, invite=[other])
        assert isinstance(answer, nio.RoomCreateResponse), answer
        return str(answer.room_id)

    async def group(self, *invite: str, name: str = "group") -> str:
        answer = await self.client.room_create(name=name, invite=list(invite))
        assert isinstance(answer, nio.RoomCreateResponse), answer
        return str(answer.room_id)

    async def join(self, room_id: str) -> None:
        answer = await self.client.join(room_id)
        assert isinstance(answer, nio.JoinResponse), answer

    async def say(self, room_id: str, text: str, **extra: Any) -> str:
        """Post ``m.text`` (plus ``extra`` content keys); the event id."""
        return await self.send(room_id, {"msgtype": "m.text", "body": text, **extra})

    async def send(self, room_id: str, content: dict[str, Any],
                   kind: str = "m.room.message") -> str:
        answer = await self.client.room_send(room_id, kind, content)
        assert isinstance(answer, nio.RoomSendResponse), answer
        return str(answer.event_id)

    async def events(self, room_id: str) -> list[dict[str, Any]]:
        """Every event of the room, oldest first (raw, as clients get them)."""
        answer = await self.client.room_messages(room_id, start=None, limit=1000)
        assert isinstance(answer, nio.RoomMessagesResponse), answer
        return [e.source for e in reversed(answer.chunk)]

    async def wait_for(self, room_id: str, check: Callable[[dict[str, Any]], bool], *,
                       count: int = 1, limit: float = 20) -> list[dict[str, Any]]:
        """The room's events passing ``check``, once there are ``count`` (syncing)."""
        async with asyncio.timeout(limit):  # a hang guard, not a measurement
            while True:
                found = [e for e in await self.events(room_id) if check(e)]
                if len(found) >= count:
                    return found
                answer = await self.client.sync(timeout=2000, since=self.since)
                if isinstance(answer, nio.SyncResponse):
                    self.since = answer.next_batch


def from_bot(bot_id: str) -> Callable[[dict[str, Any]], bool]:
    """``check`` for :meth:`User.wait_for`: a message (not an edit) the bot posted."""
    def check(event: dict[str, Any]) -> bool:
        content = event.get("content") or {}
        relation = content.get("m.relates_to") or {}
        return (event.get("sender") == bot_id and event.get("type") == "m.room.message"
                and relation.get("rel_type") != "m.replace")
    return check


def _config(directory: Path, port: int, secret: str) -> dict[str, Any]:
    limits = {
        "rc_message": LOOSE, "rc_registration": LOOSE,
        "rc_login": {"address": LOOSE, "account": LOOSE, "failed_attempts": LOOSE},
        "rc_joins": {"local": LOOSE, "remote": LOOSE}, "rc_joins_per_room": LOOSE,
        "rc_invites": {"per_room": LOOSE, "per_user": LOOSE, "per_issuer": LOOSE},
        "rc_admin_redaction": LOOSE, "rc_presence": {"per_user": LOOSE},
        "rc_media_create": LOOSE,
    }
    return {
        "server_name": "localhost",
        "pid_file": str(directory / "homeserver.pid"),
        "listeners": [{"port": port, "bind_addresses": ["127.0.0.1"], "type": "http",
                       "tls": False, "x_forwarded": False,
                       "resources": [{"names": ["client"], "compress": False}]}],
        "database": {"name": "sqlite3", "args": {"database": str(directory / "hs.db")}},
        "media_store_path": str(directory / "media"),
        "max_upload_size": "2M",
        "enable_authenticated_media": True,
        "registration_shared_secret": secret,
        "macaroon_secret_key": secrets.token_hex(16),
        "form_secret": secrets.token_hex(16),
        "signing_key_path": str(directory / "signing.key"),
        "trusted_key_servers": [],
        "suppress_key_server_warning": True,
        "report_stats": False,
        "bcrypt_rounds": 4,
        "enable_metrics": False,
        "presence": {"enabled": False},
        "url_preview_enabled": False,
        "federation_domain_whitelist": [],
        **limits,
    }


def start(directory: Path) -> Synapse:
    """Start Synapse on a free loopback port; returns once its client API answers."""
    python = _python()
    began = time.monotonic()
    directory.mkdir(parents=True, exist_ok=True)
    seed = base64.b64encode(secrets.token_bytes(32)).decode().rstrip("=")
    (directory / "signing.key").write_text(f"ed25519 a_test {seed}\n")
    port, secret = free_port(), secrets.token_hex(16)
    config = directory / "homeserver.yaml"
    config.write_text(yaml.safe_dump(_config(directory, port, secret)))
    log = (directory / "synapse.log").open("wb")
    proc = subprocess.Popen([str(python), "-m", "synapse.app.homeserver", "-c", str(config)],
                            cwd=directory, stdout=log, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL)
    server = Synapse(directory, port, secret, proc)
    deadline = time.monotonic() + 120  # a hang guard: it starts in ~10 s on a busy machine
    while True:
        if proc.poll() is not None:
            pytest.fail(f"Synapse exited ({proc.returncode}):\n{server.log_tail()}")
        with contextlib.suppress(OSError), urllib.request.urlopen(
                f"{server.url}/_matrix/client/versions", timeout=2):
            break
        if time.monotonic() > deadline:
            server.stop()
            pytest.fail(f"Synapse did not answer in 120 s:\n{server.log_tail()}")
        time.sleep(0.1)
    server.started_in = time.monotonic() - began
    return server


class Proxy:
    """A forwarding proxy in front of Synapse that can break what a real server will not:
    hold a request (answered never, as when a process dies mid-call) after or without
    passing it on, or answer with a gateway's HTML error page."""

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream
        self.port = free_port()
        self.hold: Callable[[aiohttp.web.Request], bool] | None = None
        """Requests matching this are held; :attr:`held` is set when one arrives."""
        self.forward_held = False
        self.held = asyncio.Event()
        self.bad_gateway = False
        """Answer every request with an nginx-style 502 page while set."""
        self.released = asyncio.Event()
        self.runner: aiohttp.web.AppRunner | None = None
        self.session: aiohttp.ClientSession | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def start(self) -> None:
        app = aiohttp.web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_route("*", "/{tail:.*}", self.handle)
        self.runner = aiohttp.web.AppRunner(app)
        await self.runner.setup()
        await aiohttp.web.TCPSite(self.runner, "127.0.0.1", self.port).start()
        self.session = aiohttp.ClientSession()

    async def close(self) -> None:
        self.released.set()
        if self.runner is not None:
            await self.runner.cleanup()
        if self.session is not None:
            await self.session.close()

    async def handle(self, request: aiohttp.web.Request) -> aiohttp.web.StreamResponse:
        if self.bad_gateway:
            return aiohttp.web.Response(status=502, content_type="text/html",
                                        text="<html><body><h1>502 Bad Gateway</h1></body></html>")
        held = self.hold is not None and self.hold(request)
        if held and not self.forward_held:
            self.held.set()
            await self.released.wait()  # never answered (until the proxy closes)
            raise aiohttp.web.HTTPServiceUnavailable
        assert self.session is not None
        body = await request.read()
        headers = {k: v for k, v in request.headers.items()
                   if k.lower() in ("authorization", "content-type")}
        async with self.session.request(request.method, self.upstream + request.path_qs,
                                        data=body, headers=headers,
                                        allow_redirects=False) as answer:
            data = await answer.read()
            if held:
                self.held.set()
                await self.released.wait()  # it took effect; the answer is lost
                raise aiohttp.web.HTTPServiceUnavailable
            return aiohttp.web.Response(status=answer.status, body=data, headers={
                "Content-Type": answer.headers.get("Content-Type", "application/json")})


def sends_a_message(request: aiohttp.web.Request) -> bool:
    """``hold`` for :class:`Proxy`: the bot posting a message."""
    return request.method == "PUT" and "/send/m.room.message/" in request.path
