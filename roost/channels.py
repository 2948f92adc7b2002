"""The kit for writing a channel: what Roost's own adapters are built from.

A channel plugin imports from here and from :mod:`roost` (never from ``bot`` or
``channels``): the delivery helpers that honour rate limits and retry transient
failures, the chunker, the in-flight tracker that lets ``stop()`` finish sends,
the capped media download and upload helpers, the events a platform reports
besides messages, and the HTTP listener pieces for webhooks. Names here are kept
as stable as those in :mod:`roost`.
"""

from __future__ import annotations

from bot.config.settings import SetupError
from bot.contracts.channel import (
    ALONE,
    READY,
    Capabilities,
    ChannelState,
    Leadership,
    LiveReplicas,
    MemoryState,
    SendingMark,
    Undeliverable,
    WebRoutes,
    found_nothing_shown,
    found_shown,
    sending_mark,
)
from bot.contracts.messages import (
    MAX_BUTTON_DATA,
    MAX_BUTTON_LABEL,
    Button,
    ButtonPress,
    ButtonRows,
    InboundEvent,
    MessageDeletion,
    MessageEdit,
    ReactionEvent,
    clean_text,
    parse_command,
)
from bot.media.images import inspect_image
from bot.media.sniff import extension_for
from channels.chunking import split_message
from channels.delivery import (
    BOT,
    DeliveryPolicy,
    EditStream,
    Limits,
    Rate,
    RateLimited,
    RateLimiter,
    Transient,
    deliver,
)
from channels.fetching import fetch_capped, read_capped
from channels.inflight import InFlight
from channels.logline import short
from channels.uploading import opened_files

__all__ = [
    "ALONE",
    "BOT",
    "MAX_BUTTON_DATA",
    "MAX_BUTTON_LABEL",
    "READY",
    "Button",
    "ButtonPress",
    "ButtonRows",
    "Capabilities",
    "ChannelState",
    "DeliveryPolicy",
    "EditStream",
    "InFlight",
    "InboundEvent",
    "Leadership",
    "Limits",
    "LiveReplicas",
    "MemoryState",
    "MessageDeletion",
    "MessageEdit",
    "Rate",
    "RateLimited",
    "RateLimiter",
    "ReactionEvent",
    "SendingMark",
    "SetupError",
    "Transient",
    "Undeliverable",
    "WebRoutes",
    "clean_text",
    "deliver",
    "extension_for",
    "fetch_capped",
    "found_nothing_shown",
    "found_shown",
    "inspect_image",
    "opened_files",
    "parse_command",
    "read_capped",
    "sending_mark",
    "short",
    "split_message",
]
