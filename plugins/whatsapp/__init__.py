"""Built-in plugin: WhatsApp (Meta's WhatsApp Business Cloud API) as a channel.

Built only on the public API (:mod:`roost`, :mod:`roost.channels`) and aiohttp, as a
third-party channel would be. Set ``WHATSAPP_PHONE_NUMBER_ID``,
``WHATSAPP_ACCESS_TOKEN``, ``WHATSAPP_APP_SECRET`` and ``WHATSAPP_VERIFY_TOKEN``
(or the ``[plugins."plugins.whatsapp"]`` table) and ``ROOST_HTTP_PORT``; the
webhook is ``/whatsapp/webhook`` on that port. See docs/platforms/whatsapp.md.
"""

from __future__ import annotations

from pydantic import BaseModel

from plugins.whatsapp.config import WhatsAppConfig, config_of, configured
from roost import Channel, ChannelSpec, Settings, hookimpl

__all__ = ["WhatsAppConfig", "roost_channels", "roost_plugin_config_model"]


def _create(settings: Settings) -> Channel:
    from plugins.whatsapp.channel import WhatsAppChannel

    return WhatsAppChannel(config_of(settings.plugins))


@hookimpl
def roost_channels(settings: Settings) -> list[ChannelSpec]:
    """WhatsApp, when its phone number id and access token are set."""
    return [ChannelSpec("whatsapp", lambda s: configured(s.plugins), _create)]


@hookimpl
def roost_plugin_config_model() -> type[BaseModel]:
    """The ``[plugins."plugins.whatsapp"]`` table (:class:`WhatsAppConfig`)."""
    return WhatsAppConfig
