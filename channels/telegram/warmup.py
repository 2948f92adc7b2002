"""aiogram's validators built ahead of the first update, and its response models kept."""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from aiogram.methods import (
    DeleteMessage,
    DeleteWebhook,
    EditMessageText,
    GetFile,
    GetMe,
    GetUpdates,
    SendChatAction,
    SendDocument,
    SendMessage,
    SendPhoto,
    SetMyCommands,
    SetWebhook,
)
from aiogram.methods.base import Response
from aiogram.types import Update

log = logging.getLogger("roost.channels.telegram")

_RESPONSE_MODELS: list[Any] = []


def keep_response_models() -> None:
    """Build the ``Response[...]`` model of each method Roost calls once, and keep it.

    aiogram parametrizes ``Response[method.__returning__]`` on every call, and
    pydantic caches parametrized models only weakly: each time the garbage
    collector takes one, the next call builds it again (once per reply for a
    ``Message``). Holding them makes the cache hit.
    """
    if _RESPONSE_MODELS:
        return
    methods: tuple[Any, ...] = (GetMe, GetUpdates, SendMessage, EditMessageText,
                                DeleteMessage, SendChatAction, SetMyCommands, SetWebhook,
                                DeleteWebhook, GetFile, SendPhoto, SendDocument)
    generic: Any = Response
    _RESPONSE_MODELS.extend(generic[m.__returning__] for m in methods)


BUILT = (GetUpdates, SendMessage, EditMessageText, SendPhoto, SendDocument)
"""Methods whose answers need the validators :func:`build_validators` builds (``Update``,
``Message``); the others answer ``True`` or small types."""
BUILDING = threading.Lock()
"""Held while :func:`build_validators` runs."""


def build_validators() -> None:
    """Build the validators of the types and methods Roost uses now (in a thread).

    aiogram's types are built on first use (:mod:`channels.telegram_lazy`):
    left to the first update, ``Update``, ``Message`` and the responses of the
    methods a reply calls would be built inside that update's answer. The
    channel runs this in a thread once polling has begun; a response parsed
    meanwhile waits for it (``TolerantSession.check_response``) instead of
    building the same schemas a second time.
    """
    began = time.perf_counter()
    with BUILDING:
        keep_response_models()
        for model in (Update, SendMessage, EditMessageText, DeleteMessage, SendChatAction,
                      *_RESPONSE_MODELS):
            model.model_rebuild()
    log.debug("telegram: validators built in %.2fs", time.perf_counter() - began)
