"""Built-in plugin: the ``email`` channel, a mailbox read over IMAP and answered over SMTP.

Set ``EMAIL_IMAP_URL``, ``EMAIL_SMTP_URL``, ``EMAIL_ADDRESS`` and ``EMAIL_PASSWORD``
(``EMAIL_USERNAME`` when the login is not the address), or the same keys in the
plugin's table, and install the extra (``pip install 'roost[email]'``)::

    [plugins."plugins.mail"]
    imap_url = "imaps://imap.example.com"
    smtp_url = "smtps://smtp.example.com"
    address = "roost@example.com"

The plugin is built on the public API only (:mod:`roost`, :mod:`roost.channels`):
the worked example of a channel plugin. The SDKs (aioimaplib, aiosmtplib) are
imported only when the channel starts.
"""

from __future__ import annotations

from pydantic import BaseModel

from plugins.mail.config import CHANNEL_NAME, PLUGIN_NAME, MailConfig, configured
from roost import Channel, ChannelSpec, Settings, hookimpl

__all__ = ["CHANNEL_NAME", "PLUGIN_NAME", "MailConfig", "roost_channels",
           "roost_plugin_config_model"]


def _create(settings: Settings) -> Channel:
    from plugins.mail.channel import EmailChannel  # imports aioimaplib and aiosmtplib

    return EmailChannel(settings)


@hookimpl
def roost_plugin_config_model() -> type[BaseModel]:
    """The ``[plugins."plugins.mail"]`` table."""
    return MailConfig


@hookimpl
def roost_channels(settings: Settings) -> ChannelSpec:
    """The ``email`` channel, started when ``EMAIL_IMAP_URL`` is set."""
    return ChannelSpec(CHANNEL_NAME, configured, _create)
