"""Inbound mail to the core's messages: who wrote, in which thread, what they said.

A mail is for Roost unless a machine sent it: ``Auto-Submitted`` other than ``no``
(vacation replies, bounces, Roost's own replies), a ``List-Id`` or ``List-Unsubscribe``
(mailing lists), ``Precedence`` ``bulk``/``list``/``junk``, a null or
``MAILER-DAEMON`` sender. Such mail is skipped and never answered, so two
auto-responders cannot loop.

The thread is found from ``References`` (its first id is the thread's root) or
``In-Reply-To``; a mail with neither starts a thread of its own. The thread key
hashes the sender with the root, so nobody can write into someone else's thread.
The text is the plain part, else the HTML part turned into text, with quoted
history (``>`` lines, ``On ... wrote:`` and what follows, ``<blockquote>``) cut.
Parts with a file name, and non-text parts, are attachments; their ``url`` says
where they are (``uidvalidity/uid/part``) for :meth:`EmailChannel.download`.
"""

from __future__ import annotations

import email.policy
import hashlib
import re
from dataclasses import dataclass
from email.headerregistry import Address
from email.message import EmailMessage, Message, MIMEPart
from email.parser import BytesParser
from email.utils import getaddresses
from html.parser import HTMLParser

from roost import Attachment

_PARSER = BytesParser(policy=email.policy.default)
_MSGID = re.compile(r"<[^<>\s]{1,500}>")
_WROTE = re.compile(r"^(On .{0,300} wrote:|Am .{0,300} schrieb .{0,100}:|Le .{0,300} a écrit ?:"
                    r"|-{2,}\s*Original Message\s*-{2,}|-{2,}\s*Forwarded message\s*-{2,})\s*$",
                    re.IGNORECASE)
MAX_REFERENCES = 20
"""Ids kept in a reply's ``References`` (the root and the newest)."""
KINDS = {"image": "photo", "audio": "audio", "video": "video"}


def parse(raw: bytes) -> EmailMessage:
    """The mail in ``raw`` (never raises: a broken mail parses to what can be read)."""
    message = _PARSER.parsebytes(raw)
    assert isinstance(message, EmailMessage)
    return message


def header(message: Message, name: str) -> str:
    """Header ``name`` as text (``""`` when absent or unreadable)."""
    try:
        value = message.get(name)
    except (ValueError, TypeError, IndexError):
        return ""
    return "" if value is None else str(value).strip()


def automated(message: Message) -> str | None:
    """Why ``message`` was sent by a machine (``None``: a person wrote it)."""
    auto = header(message, "Auto-Submitted").lower()
    if auto and auto.split(";", 1)[0].strip() != "no":
        return f"Auto-Submitted: {auto[:40]}"
    for name in ("List-Id", "List-Unsubscribe", "List-Post"):
        if header(message, name):
            return f"a mailing list ({name})"
    precedence = header(message, "Precedence").lower()
    if precedence in ("bulk", "list", "junk"):
        return f"Precedence: {precedence}"
    if header(message, "X-Autoreply") or header(message, "X-Autorespond"):
        return "an auto-reply"
    return None


def sender(message: Message) -> tuple[str, str] | None:
    """``(address, display name)`` of ``From`` (the address lower-cased), or ``None``."""
    pairs = getaddresses([header(message, "From")])
    if len(pairs) != 1:
        return None
    name, address = pairs[0]
    address = address.strip().lower()
    local, at, domain = address.rpartition("@")
    if not at or not local or not domain or any(c.isspace() or c in "<>,;:\"'" for c in address):
        return None
    if local in ("mailer-daemon", "postmaster") or local.startswith("noreply") \
            or local.startswith("no-reply"):
        return None
    return address, name.strip()


def authenticated(message: Message, authserv_id: str, address: str) -> str | None:
    """Why ``message`` does not prove it comes from ``address``'s domain (``None``: it does).

    The proof is the topmost ``Authentication-Results`` header of the server named
    ``authserv_id`` (the receiving server adds its own on top and removes forged ones):
    ``dmarc=pass``, or ``dkim=pass`` for the sender's domain (or a parent of it).
    """
    domain = address.rpartition("@")[2]
    try:
        results = message.get_all("Authentication-Results") or []
    except (ValueError, TypeError, IndexError):
        results = []
    for raw in results:
        server, _, rest = " ".join(str(raw).split()).partition(";")
        if server.strip().split(" ")[0].lower() != authserv_id.lower():
            continue
        for method in rest.split(";"):
            words = method.strip().lower().split()
            if not words:
                continue
            name, _, verdict = words[0].partition("=")
            props = dict(w.partition("=")[::2] for w in words[1:] if "=" in w)
            if name == "dmarc" and verdict == "pass" \
                    and props.get("header.from", domain) == domain:
                return None
            signer = props.get("header.d", "")
            if name == "dkim" and verdict == "pass" and signer \
                    and (domain == signer or domain.endswith("." + signer)):
                return None
        return f"{authserv_id} did not pass DMARC or DKIM for {domain}"
    return f"no Authentication-Results from {authserv_id}"


_ADDRESS = re.compile(r"[^@\s<>,;:\"'()\[\]\\]{1,64}@[A-Za-z0-9.-]{1,253}")


def is_address(text: str) -> bool:
    """Whether ``text`` is one plain mail address and nothing else (a reply's recipient)."""
    return _ADDRESS.fullmatch(text) is not None


def message_ids(value: str) -> list[str]:
    """The ``<id>`` tokens of a ``References``/``In-Reply-To`` header, in order."""
    return _MSGID.findall(value)


def thread_key(address: str, root: str) -> str:
    """The thread's key: the sender's address and the thread's root id, hashed."""
    return hashlib.sha256(f"{address}\0{root}".encode()).hexdigest()[:20]


@dataclass(frozen=True, slots=True)
class Thread:
    """Where a mail sits: its own id, the ids it answers, and the thread they make."""

    message_id: str
    references: tuple[str, ...]
    subject: str
    starts: bool
    """The mail starts a thread (it answers nothing)."""

    @property
    def root(self) -> str:
        """The thread's first mail's id."""
        return self.references[0] if self.references else self.message_id

    def reply_references(self) -> list[str]:
        """``References`` of a reply to this mail: the root and the newest ids (bounded)."""
        return bounded([*self.references, self.message_id])


def bounded(chain: list[str]) -> list[str]:
    """``chain`` cut to :data:`MAX_REFERENCES` ids: its first (the root) and the newest."""
    return chain if len(chain) <= MAX_REFERENCES else \
        [chain[0], *chain[-(MAX_REFERENCES - 1):]]


def thread_of(message: Message, fallback_id: str) -> Thread:
    """The mail's place in its thread; ``fallback_id`` stands in for a missing ``Message-ID``."""
    own = message_ids(header(message, "Message-ID"))
    refs = message_ids(header(message, "References"))
    for parent in message_ids(header(message, "In-Reply-To"))[:1]:
        if parent not in refs:
            refs.append(parent)
    subject = " ".join(header(message, "Subject").split())[:200]
    return Thread(own[0] if own else fallback_id, tuple(bounded(refs)), subject,
                  starts=not refs)


class _Text(HTMLParser):
    """HTML to readable text: blocks on lines of their own, links kept, quotes dropped."""

    BLOCKS = frozenset({"p", "div", "br", "li", "tr", "h1", "h2", "h3", "h4", "h5", "h6",
                        "pre", "table", "ul", "ol", "hr"})
    SKIP = frozenset({"script", "style", "head", "title", "blockquote"})

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.out: list[str] = []
        self.skipping: list[str] = []
        self.href: str | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        named = dict(attrs)
        classes = (named.get("class") or "").split()
        if tag in self.SKIP or "gmail_quote" in classes or named.get("type") == "cite":
            if tag not in ("br", "hr"):
                self.skipping.append(tag)
            return
        if self.skipping:
            return
        if tag in self.BLOCKS:
            self.out.append("\n")
        if tag == "li":
            self.out.append("- ")
        if tag == "a":
            self.href = named.get("href")

    def handle_endtag(self, tag: str) -> None:
        if self.skipping:
            if self.skipping[-1] == tag:
                self.skipping.pop()
            return
        if tag == "a" and self.href and self.href.startswith(("http://", "https://")):
            self.out.append(f" ({self.href})")
            self.href = None
        if tag in self.BLOCKS:
            self.out.append("\n")

    def handle_data(self, data: str) -> None:
        if not self.skipping:
            self.out.append(data)


def html_to_text(markup: str) -> str:
    """The readable text of an HTML body (quoted parts left out)."""
    parser = _Text()
    try:
        parser.feed(markup)
        parser.close()
    except (AssertionError, ValueError):
        pass  # what was read so far stands
    lines = [" ".join(line.split()) for line in "".join(parser.out).splitlines()]
    text = "\n".join(lines)
    return re.sub(r"\n{3,}", "\n\n", text).strip()


def strip_quoted(text: str) -> str:
    """``text`` without the quoted history a mail client put under (or over) the reply."""
    kept: list[str] = []
    for line in text.replace("\r\n", "\n").split("\n"):
        if _WROTE.match(line.strip()):
            break
        if line.lstrip().startswith(">"):
            continue
        kept.append(line.rstrip())
    while kept and kept[-1] == "":
        kept.pop()
    # A signature ("-- " on its own line) is not part of what was said.
    if "-- " in kept:
        kept = kept[:kept.index("-- ")]
    return "\n".join(kept).strip()


def _decoded(part: MIMEPart) -> str:
    try:
        content = part.get_content()
    except (LookupError, ValueError, AssertionError):
        payload = part.get_payload(decode=True)
        content = payload.decode("utf-8", "replace") if isinstance(payload, bytes) else ""
    return content if isinstance(content, str) else ""


def body_text(message: EmailMessage) -> str:
    """What the person wrote: the plain part (else the HTML one as text), quotes cut."""
    try:
        part = message.get_body(preferencelist=("plain", "html"))
    except (KeyError, ValueError, IndexError):
        part = None
    if part is None:
        return ""
    text = _decoded(part)
    if part.get_content_subtype() == "html":
        text = html_to_text(text)
    return strip_quoted(text)


def parts(message: EmailMessage) -> list[EmailMessage]:
    """Every leaf part, in order (a stable numbering for :func:`part_at`)."""
    return [p for p in message.walk() if not p.is_multipart() and isinstance(p, EmailMessage)]


def part_at(message: EmailMessage, index: int) -> EmailMessage | None:
    """Leaf part ``index`` of ``message`` (see :func:`parts`)."""
    leaves = parts(message)
    return leaves[index] if 0 <= index < len(leaves) else None


def attachments(message: EmailMessage, where: str) -> tuple[Attachment, ...]:
    """The files the mail carries; ``where`` (``uidvalidity/uid``) makes their ``url``."""
    try:
        body = message.get_body(preferencelist=("plain", "html"))
    except (KeyError, ValueError, IndexError):
        body = None
    found: list[Attachment] = []
    for index, part in enumerate(parts(message)):
        if part is body:
            continue
        name = part.get_filename() or ""
        maintype = part.get_content_maintype()
        if not name and maintype in ("text", "multipart", "message"):
            continue  # an alternative body, not a file
        mime = part.get_content_type()
        payload = part.get_payload()
        size = len(payload) * 3 // 4 if isinstance(payload, str) else 0
        kind = KINDS.get(maintype, "document")
        found.append(Attachment(kind=kind, name=name or f"part-{index}", url=f"{where}/{index}",
                                mime_type=mime, size=size))
    return tuple(found)


def payload_of(part: EmailMessage) -> bytes:
    """The decoded bytes of one part."""
    payload = part.get_payload(decode=True)
    return payload if isinstance(payload, bytes) else b""


def format_address(address: str, name: str) -> str:
    """``Name <address>`` for a header (quoted as needed)."""
    local, _, domain = address.partition("@")
    return str(Address(display_name=name, username=local, domain=domain))
