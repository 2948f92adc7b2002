"""``[plugins."plugins.whatsapp"]``: the WhatsApp Cloud API channel's settings.

Each credential has its own environment variable (``WHATSAPP_ACCESS_TOKEN``...),
which beats the table, as every variable does.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, SecretStr

PLUGIN_NAME = "plugins.whatsapp"

DEFAULT_API_BASE = "https://graph.facebook.com/v21.0"


class WhatsAppConfig(BaseModel):
    """``[plugins."plugins.whatsapp"]``: Meta's WhatsApp Business Cloud API as a channel."""

    model_config = ConfigDict(extra="forbid")

    phone_number_id: str = ""
    """``WHATSAPP_PHONE_NUMBER_ID``: the business phone number's id (not the number);
    empty: the channel is off."""
    access_token: SecretStr | None = None
    """``WHATSAPP_ACCESS_TOKEN``: a system user's permanent token with
    ``whatsapp_business_messaging``."""
    app_secret: SecretStr | None = None
    """``WHATSAPP_APP_SECRET``: the Meta app's secret, which signs every webhook delivery."""
    verify_token: SecretStr | None = None
    """``WHATSAPP_VERIFY_TOKEN``: the string you typed into the webhook's "Verify token"."""
    api_base: str = DEFAULT_API_BASE
    """``WHATSAPP_API_BASE``: the Graph API with its version (a proxy or a test server)."""
    template_name: str = ""
    """A pre-approved message template sent instead of a reply due outside the 24-hour
    customer-service window; its body's one variable ``{{1}}`` gets the reply (flattened to
    one line, clipped). Empty: such a reply is recorded as undeliverable."""
    template_language: str = "en"
    """The template's language code (``en``, ``en_US``, ``de``...)."""
    rate_limit_wait: float = Field(default=1.0, ge=0)
    """Seconds to hold all sends after error 130429 (the number's throughput)."""
    pair_rate_limit_wait: float = Field(default=6.0, ge=0)
    """Seconds to hold sends to one person after error 131056 (WhatsApp allows about one
    message every 6 s to the same user beyond short bursts)."""
    timeout: float = Field(default=30.0, gt=0)
    """Seconds each Graph API call may take before it counts as a transient failure."""


def config_of(plugins: dict[str, Any]) -> WhatsAppConfig:
    """The validated table out of ``settings.plugins`` (defaults when absent)."""
    return WhatsAppConfig.model_validate(plugins.get(PLUGIN_NAME) or {})


def configured(plugins: dict[str, Any]) -> bool:
    """Whether the phone number id and the access token are set (the channel starts)."""
    table = plugins.get(PLUGIN_NAME) or {}
    return bool(table.get("phone_number_id")) and bool(table.get("access_token"))
