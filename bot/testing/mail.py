"""Real mail servers for tests: Dovecot for IMAP, aiosmtpd for SMTP.

:class:`Dovecot` runs Debian's ``dovecot`` (package ``dovecot-imapd``) as a test
instance in the foreground (``dovecot -F -c CONFIG``): its own config, a
passwd-file user database and Maildirs under a temp dir, IMAP on a free
127.0.0.1 port, plain-text logins (no TLS). Mail reaches a mailbox as a mail
client's would, by IMAP ``APPEND``; ``doveadm`` changes a mailbox's UIDVALIDITY
and kicks sessions. Start one per test session; :meth:`Dovecot.add_user` gives
each test a mailbox of its own.

:class:`SmtpSink` is an aiosmtpd server on the test's event loop that requires a
login and keeps what it accepted; it can answer the next mails with a given
code, or hold one in ``DATA`` until the test releases it.
"""

from __future__ import annotations

import asyncio
import contextlib
import email.policy
import imaplib
import itertools
import os
import shlex
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import warnings
from dataclasses import dataclass, field
from email.message import EmailMessage
from email.parser import BytesParser
from pathlib import Path
from typing import Any

__all__ = ["Dovecot", "DovecotUnavailable", "Held", "SmtpSink", "free_port"]


class DovecotUnavailable(RuntimeError):
    """Dovecot is not installed (``apt-get install dovecot-imapd``)."""


USERS = 100
"""Mailboxes a :class:`Dovecot` instance has (``user1``...)."""

MAIL_UID = 65533
"""The uid (and gid) a root-run :class:`Dovecot` stores mail as: no account's (Debian
reserves 65000-65533 and makes none there), so its IMAP processes never count as another
user's, such as ``nobody``'s or a sandbox uid pool's (whose claims pass over a busy uid)."""


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


_CONFIG = """\
base_dir = {base}/run
state_dir = {base}/state
instance_name = roost-test-{port}
log_path = {base}/dovecot.log
protocols = imap
listen = 127.0.0.1
ssl = no
disable_plaintext_auth = no
auth_mechanisms = plain login
mail_location = maildir:{base}/mail/%u
first_valid_uid = 1
passdb {{
  driver = passwd-file
  args = scheme=PLAIN username_format=%u {base}/passwd
}}
userdb {{
  driver = static
  args = uid={uid} gid={gid} home={base}/home/%u
}}
service imap-login {{
  chroot =
  inet_listener imap {{
    address = 127.0.0.1
    port = {port}
  }}
  inet_listener imaps {{
    port = 0
  }}
}}
service anvil {{
  chroot =
}}
"""


class Dovecot:
    """One running Dovecot test instance; :meth:`stop` ends it and removes its files."""

    def __init__(self) -> None:
        binary = shutil.which("dovecot") or "/usr/sbin/dovecot"
        if not os.path.exists(binary):
            raise DovecotUnavailable("dovecot not found: apt-get install dovecot-imapd")
        self.binary = binary
        self.doveadm = shutil.which("doveadm") or "/usr/bin/doveadm"
        self.base = Path(tempfile.mkdtemp(prefix="roost-dovecot-"))
        self.port = free_port()
        self.config = self.base / "dovecot.conf"
        self.process: subprocess.Popen[bytes] | None = None
        self._watchdog: subprocess.Popen[bytes] | None = None
        self._users = itertools.count(1)
        self._noidle = itertools.count(1)
        # Mail is stored as an unprivileged uid (Dovecot refuses root for mail).
        if os.geteuid() == 0:
            self.uid = self.gid = MAIL_UID
        else:
            self.uid, self.gid = os.geteuid(), os.getegid()

    def start(self) -> Dovecot:
        """Write the config, start the server, wait until it takes connections."""
        for sub in ("mail", "home"):
            (self.base / sub).mkdir()
            os.chown(self.base / sub, self.uid, self.gid)
        os.chmod(self.base, 0o755)
        # Dovecot rereads the passwd file when its mtime changes, which a second write
        # within the same second may not: every mailbox is made now, used one by one.
        # The noidle users' server offers no IDLE (a per-user capability list).
        (self.base / "passwd").write_text("".join(
            [f"user{n}:{{PLAIN}}secret\n" for n in range(1, USERS + 1)]
            + [f"noidle{n}:{{PLAIN}}secret::::::userdb_imap_capability=IMAP4rev1\n"
               for n in range(1, 6)]))
        self.config.write_text(_CONFIG.format(base=self.base, port=self.port, uid=self.uid,
                                              gid=self.gid))
        # A process group of its own: stop() ends the master and its children at once.
        self.process = subprocess.Popen([self.binary, "-F", "-c", str(self.config)],
                                        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                        stderr=subprocess.PIPE, start_new_session=True)
        deadline = time.monotonic() + 30  # a hang guard, not a measurement
        while True:
            if self.process.poll() is not None:
                error = self.process.stderr.read() if self.process.stderr else b""
                raise DovecotUnavailable(f"dovecot exited: {error.decode()[-2000:]}")
            with contextlib.suppress(OSError), socket.create_connection(
                    ("127.0.0.1", self.port), timeout=1) as probe:
                if probe.recv(64).startswith(b"* OK"):
                    self._watch()
                    return self
            if time.monotonic() > deadline:
                raise DovecotUnavailable("dovecot did not take connections within 30 s")
            time.sleep(0.05)

    def _watch(self) -> None:
        """End the server if this process dies without :meth:`stop` (a timeout's kill, an
        interrupted xdist worker): a server never outlives the tests that started it."""
        assert self.process is not None
        script = (f"while kill -0 {os.getpid()} 2>/dev/null; do sleep 1; done; "
                  f"kill -KILL -{self.process.pid} 2>/dev/null; "
                  f"rm -rf {shlex.quote(str(self.base))}")
        self._watchdog = subprocess.Popen(
            ["sh", "-c", script], start_new_session=True, stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def stop(self) -> None:
        """End the server and its processes (nothing of a test server needs a clean
        shutdown: SIGTERM makes the master wait a second for its children) and remove
        its directory."""
        if self._watchdog is not None:
            self._watchdog.kill()
            self._watchdog.wait()
            self._watchdog = None
        if self.process is not None:
            if self.process.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()
            if self.process.stderr is not None:
                self.process.stderr.close()
        shutil.rmtree(self.base, ignore_errors=True)

    def add_user(self, *, idle: bool = True) -> str:
        """A mailbox no test used yet (password ``secret``); its login name. ``idle=False``:
        one whose server offers no IDLE after login (five of those)."""
        if not idle:
            return f"noidle{next(self._noidle)}"
        number = next(self._users)
        if number > USERS:
            raise RuntimeError(f"only {USERS} mailboxes per Dovecot instance")
        return f"user{number}"

    def client(self, user: str, password: str = "secret") -> imaplib.IMAP4:
        """A logged-in stdlib IMAP client (a mail client's side)."""
        imap = imaplib.IMAP4("127.0.0.1", self.port, timeout=30)
        imap.login(user, password)
        return imap

    def deliver(self, user: str, mail: bytes | EmailMessage, *,
                received: float | None = None) -> int:
        """Put ``mail`` into ``user``'s INBOX (IMAP APPEND); its UID. ``received``: the
        INTERNALDATE to give it (seconds since the epoch; default now)."""
        raw = mail if isinstance(mail, bytes) else mail.as_bytes(policy=email.policy.SMTP)
        imap = self.client(user)
        date = None if received is None else imaplib.Time2Internaldate(received)
        try:
            status, data = imap.append("INBOX", None, date, raw)
            assert status == "OK", data
            text = (data[0] or b"").decode()
            return int(text.split("APPENDUID", 1)[1].split()[1].rstrip("]"))
        finally:
            imap.logout()

    def flags(self, user: str, uid: int) -> str:
        """The flags of mail ``uid`` in ``user``'s INBOX."""
        imap = self.client(user)
        try:
            imap.select("INBOX", readonly=True)
            _, data = imap.uid("fetch", str(uid), "(FLAGS)")
            return (data[0] or b"").decode() if isinstance(data[0], bytes) else str(data[0])
        finally:
            imap.logout()

    def admin(self, *args: str) -> str:
        """Run ``doveadm -c CONFIG args``; its output."""
        done = subprocess.run([self.doveadm, "-c", str(self.config), *args],
                              capture_output=True, timeout=30, check=False)
        return done.stdout.decode() + done.stderr.decode()

    def set_uidvalidity(self, user: str, value: int) -> None:
        """Give ``user``'s INBOX a new UIDVALIDITY (as a rebuilt mailbox has)."""
        out = self.admin("mailbox", "update", "-u", user, "--uid-validity", str(value), "INBOX")
        assert not out.strip(), out

    def kick(self, user: str) -> str:
        """Drop ``user``'s IMAP sessions from the server side."""
        return self.admin("kick", user)


@dataclass
class Held:
    """A mail held in ``DATA``: :meth:`release` answers it (``250`` accepts it)."""

    arrived: asyncio.Event = field(default_factory=asyncio.Event)
    answer: asyncio.Future[str] | None = None
    mail: EmailMessage | None = None
    """The mail held (set once it ``arrived``)."""

    def release(self, reply: str) -> None:
        """Answer the held mail with ``reply`` (``"250 OK"`` delivers it)."""
        assert self.answer is not None
        if not self.answer.done():
            self.answer.set_result(reply)


class SmtpSink:
    """An SMTP server (aiosmtpd) that wants ``user``/``password`` and keeps what it took."""

    def __init__(self, user: str = "bot", password: str = "secret") -> None:
        self.user, self.password = user, password
        self.port = 0
        self.accepted: list[EmailMessage] = []
        self.envelopes: list[tuple[str, list[str]]] = []
        self.refusals: list[str] = []
        """Replies to give the next mails instead of accepting them (``451 ...``)."""
        self.attempts = 0
        self.hold: Held | None = None
        """Set: the next mail waits in ``DATA`` until released."""
        self.logins: list[str] = []
        self._server: asyncio.Server | None = None
        self._arrived = asyncio.Condition()

    async def start(self) -> SmtpSink:
        """Listen on a free 127.0.0.1 port."""
        from aiosmtpd.smtp import SMTP, AuthResult, LoginPassword

        def authenticate(server: Any, session: Any, envelope: Any, mechanism: str,
                         data: Any) -> AuthResult:
            ok = isinstance(data, LoginPassword) and data.login.decode() == self.user \
                and data.password.decode() == self.password
            if ok:
                self.logins.append(self.user)
            return AuthResult(success=ok)

        def session() -> SMTP:
            with warnings.catch_warnings():
                # Plain-text logins on the loopback interface are what the test wants.
                warnings.simplefilter("ignore", UserWarning)
                return SMTP(self, hostname="sink.test", authenticator=authenticate,
                            auth_required=True, auth_require_tls=False)

        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(session, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    @property
    def url(self) -> str:
        """``smtp://127.0.0.1:port``."""
        return f"smtp://127.0.0.1:{self.port}"

    async def close(self) -> None:
        """Stop listening."""
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 5)

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
        self.attempts += 1
        if self.refusals:
            reply = self.refusals.pop(0)
            async with self._arrived:
                self._arrived.notify_all()
            return reply
        content = envelope.content if isinstance(envelope.content, bytes) else \
            str(envelope.content).encode()
        mail = BytesParser(policy=email.policy.default).parsebytes(content)
        assert isinstance(mail, EmailMessage)
        held, self.hold = self.hold, None
        if held is not None:
            held.answer = asyncio.get_running_loop().create_future()
            held.mail = mail
            held.arrived.set()
            reply = await held.answer
            if not reply.startswith("250"):
                return reply
        async with self._arrived:
            self.accepted.append(mail)
            self.envelopes.append((envelope.mail_from, list(envelope.rcpt_tos)))
            self._arrived.notify_all()
        return "250 OK"

    async def wait_for(self, count: int = 1, *, limit: float = 20.0) -> list[EmailMessage]:
        """Wait until ``count`` mails were accepted in all; the mails accepted."""
        async with asyncio.timeout(limit), self._arrived:  # a hang guard
            await self._arrived.wait_for(lambda: len(self.accepted) >= count)
        return list(self.accepted)

    async def wait_attempts(self, count: int, *, limit: float = 20.0) -> None:
        """Wait until ``count`` mails reached ``DATA`` (accepted or refused)."""
        async with asyncio.timeout(limit), self._arrived:  # a hang guard
            await self._arrived.wait_for(lambda: self.attempts >= count)
