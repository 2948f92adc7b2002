"""The email channel's settings: the ``[plugins."plugins.mail"]`` table (``EMAIL_*`` variables)."""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import unquote, urlsplit

from pydantic import BaseModel, ConfigDict, Field, SecretStr

from roost import Settings
from roost.channels import SetupError

PLUGIN_NAME = "plugins.mail"
CHANNEL_NAME = "email"


class MailConfig(BaseModel):
    """``[plugins."plugins.mail"]``: a mailbox as a chat channel (IMAP in, SMTP out)."""

    model_config = ConfigDict(extra="forbid")

    imap_url: str | None = None
    """``EMAIL_IMAP_URL``: ``imaps://imap.example.com`` (TLS, port 993) or ``imap://host:143``
    (plain text: only on a trusted network); set, the channel runs."""
    smtp_url: str | None = None
    """``EMAIL_SMTP_URL``: ``smtps://smtp.example.com`` (TLS, port 465) or
    ``smtp://host:587`` (STARTTLS when the server offers it)."""
    address: str | None = None
    """``EMAIL_ADDRESS``: the bot's address, the ``From`` of its replies."""
    username: str | None = None
    """``EMAIL_USERNAME``: the login for IMAP and SMTP (default: the address)."""
    password: SecretStr | None = None
    """``EMAIL_PASSWORD``: the password for IMAP and SMTP."""
    smtp_username: str | None = None
    """A different login for SMTP (default: ``username``)."""
    smtp_password: SecretStr | None = None
    """A different password for SMTP (default: ``password``)."""
    trusted_authserv_id: str | None = None
    """Your mail server's name in its ``Authentication-Results`` headers (``mx.example.com``):
    set, only mail it says passed DMARC (or DKIM for the sender's domain) is read, so
    nobody can write as someone else. Unset, ``From`` is taken as it comes."""
    mailbox: str = "INBOX"
    """The folder read for new mail."""
    display_name: str = "Roost"
    """The name shown with the bot's address."""
    subject: str = "Message from Roost"
    """The subject of a mail the bot starts (a reminder), not a reply."""
    idle_seconds: float = Field(1500.0, gt=0, le=1740)
    """Seconds an IMAP IDLE lasts before it is renewed (servers drop one after 30 min)."""
    poll_seconds: float = Field(60.0, gt=0)
    """How often a server without IDLE is asked for new mail."""
    reconnect_min_seconds: float = Field(1.0, gt=0)
    """The first pause before reconnecting to IMAP (doubling each failure)."""
    reconnect_max_seconds: float = Field(300.0, gt=0)
    """The longest pause between reconnection attempts."""
    timeout: float = Field(60.0, gt=0)
    """Seconds an IMAP or SMTP command may take."""
    max_mail_bytes: int = Field(26_214_400, gt=0)
    """A mail larger than this (25 MiB) is skipped with a log line."""
    max_attachment_bytes: int = Field(20_971_520, gt=0)
    """The largest file a reply attaches (20 MiB)."""
    sends_per_minute: int = Field(30, gt=0)
    """Mails sent per minute at most (all replicas together)."""


@dataclass(frozen=True, slots=True)
class Endpoint:
    """Where a server listens and how to reach it."""

    host: str
    port: int
    tls: bool
    """Implicit TLS from the first byte (``imaps``, ``smtps``)."""


def endpoint(url: str, *, plain: str, secure: str, ports: tuple[int, int]) -> Endpoint:
    """``url`` (``plain://host[:port]`` or ``secure://...``) read; :class:`SetupError` if not."""
    parts = urlsplit(url)
    if parts.scheme not in (plain, secure) or not parts.hostname:
        raise SetupError(f"{url!r} is not a {plain}:// or {secure}:// URL with a host")
    tls = parts.scheme == secure
    try:
        port = parts.port or (ports[1] if tls else ports[0])
    except ValueError:
        raise SetupError(f"{url!r} has an invalid port") from None
    return Endpoint(unquote(parts.hostname), port, tls)


@dataclass(frozen=True, slots=True)
class MailSetup:
    """The settings resolved for connecting: endpoints and logins."""

    config: MailConfig
    imap: Endpoint
    smtp: Endpoint
    address: str
    imap_login: tuple[str, str]
    smtp_login: tuple[str, str] | None


def table(settings: Settings) -> dict[str, object]:
    """The plugin's raw table in ``settings`` (empty when absent)."""
    raw = settings.plugins.get(PLUGIN_NAME)
    return raw if isinstance(raw, dict) else {}


def configured(settings: Settings) -> bool:
    """Whether ``EMAIL_IMAP_URL`` (``imap_url``) is set: ``roost run`` then starts the channel."""
    return bool(table(settings).get("imap_url"))


def setup(settings: Settings) -> MailSetup:
    """Validate the table and name the one thing missing (:class:`SetupError`)."""
    config = MailConfig.model_validate(table(settings))
    missing = [env for env, value in (("EMAIL_IMAP_URL", config.imap_url),
                                      ("EMAIL_SMTP_URL", config.smtp_url),
                                      ("EMAIL_ADDRESS", config.address),
                                      ("EMAIL_PASSWORD", config.password)) if not value]
    if missing:
        raise SetupError(f"the email channel needs {' and '.join(missing)}")
    assert config.imap_url and config.smtp_url and config.address and config.password
    if "@" not in config.address or any(c in config.address for c in "\r\n <>,"):
        raise SetupError(f"EMAIL_ADDRESS {config.address!r} is not a mail address")
    user = config.username or config.address
    password = config.password.get_secret_value()
    smtp_user = config.smtp_username or user
    smtp_password = (config.smtp_password or config.password).get_secret_value()
    return MailSetup(
        config=config,
        imap=endpoint(config.imap_url, plain="imap", secure="imaps", ports=(143, 993)),
        smtp=endpoint(config.smtp_url, plain="smtp", secure="smtps", ports=(587, 465)),
        address=config.address.lower(), imap_login=(user, password),
        smtp_login=(smtp_user, smtp_password) if smtp_password else None)
