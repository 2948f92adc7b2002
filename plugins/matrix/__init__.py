"""Built-in plugin: the Matrix channel, on matrix-nio (``pip install 'roost[matrix]'``).

**Login.** ``MATRIX_HOMESERVER``, ``MATRIX_USER_ID`` and ``MATRIX_ACCESS_TOKEN``; or
``MATRIX_PASSWORD`` instead of the token, used once: the device it creates is kept in
the channel's notes in Roost's database and reused from then on (replicas share it).
Settings live in ``[plugins."plugins.matrix"]`` (:class:`MatrixConfig`).

**Receiving** (:mod:`plugins.matrix.sync`): ``/sync`` long polls; an answer's
``next_batch`` is recorded only after the core's handler returned for every event it
carried, so a restart neither loses nor repeats one; the event id is the inbox key.
Only the leader syncs when replicas share PostgreSQL.

**Translation** (:mod:`plugins.matrix.inbound`). ``chat_id`` is the room id, the sender
the MXID. A room of two (the bot and one person) is ``direct``; any other room is a
``group``, where a message is addressed to the bot when it mentions it (``m.mentions``,
a pill, the MXID or the display name in the text), replies to one of its messages, or is
in a thread it speaks in. A thread (``m.thread``) is a conversation of its own
(``thread_id`` its root). Edits (``m.replace``) arrive as ``MessageEdit``, reactions as
``ReactionEvent`` (their redaction as the reaction's removal), other redactions as
``MessageDeletion``. ``m.image``, ``m.file``, ``m.audio`` (voice when marked so) and
``m.video`` are attachments, downloaded through the authenticated media endpoint
(``/_matrix/client/v1/media/download``) with a byte limit. Invites are accepted when the
DM policy (a room marked ``is_direct``) or the group policy would let the inviter talk to
the bot (pairing then applies in the DM), and declined otherwise.

**Replies** (:mod:`plugins.matrix.outbound`): Markdown as written in ``body`` and
rendered to ``formatted_body`` HTML (raw HTML is escaped), split so each event stays under
the 64 KiB event limit; in a thread they stay in it, in a group they reply to the message.
Streaming posts a draft and edits it (``m.replace``) at most once per ``edit_interval``;
typing notices run while the model works. Every post has a transaction id the homeserver
dedupes on (the reply's ``delivery_id`` and piece number), so a repeat after a lost answer
or a kill -9 shows once. Files are uploaded, then sent as ``m.image``/``m.audio``/
``m.video``/``m.file``; one over the server's upload limit raises ``MediaTooLarge``.

**Errors** (:mod:`plugins.matrix.api`): ``429``/``M_LIMIT_EXCEEDED`` waits
``retry_after_ms`` and holds every call of the account meanwhile; 5xx, pages that are not
JSON, resets and timeouts are retried with backoff; other errors are final.

**Encrypted rooms** are read and answered encrypted when ``matrix-nio[e2e]`` is installed
(the extra installs it) and ``encryption`` is on: the device's keys live under the data
dir (``matrix/``), its keys are uploaded, and room keys go to every device in the room
(none is verified). An encrypted message that cannot be decrypted (its keys never reached
the bot; or no encryption support) is answered once per room, remembered in the channel's
notes, with a notice saying so: never silence.

**Buttons**: Matrix has none; :attr:`MatrixChannel.capabilities` says so.
"""

from __future__ import annotations

from pydantic import BaseModel, ValidationError

from plugins.matrix.config import PLUGIN_NAME, MatrixConfig
from roost import Channel, ChannelSpec, Settings, hookimpl

__all__ = ["MatrixConfig", "config_of", "roost_channels", "roost_plugin_config_model"]


def config_of(settings: Settings) -> MatrixConfig:
    """The validated ``[plugins."plugins.matrix"]`` table (defaults when it is invalid: the
    plugin host reports the bad keys)."""
    try:
        return MatrixConfig.model_validate(settings.plugins.get(PLUGIN_NAME) or {})
    except ValidationError:
        return MatrixConfig()


def _create(settings: Settings) -> Channel:
    # matrix-nio is imported only when the channel starts.
    from plugins.matrix.channel import MatrixChannel

    return MatrixChannel(settings, config_of(settings))


@hookimpl
def roost_channels(settings: Settings) -> list[ChannelSpec]:
    """Matrix, when its homeserver, user id and a credential are set."""
    return [ChannelSpec("matrix", lambda s: config_of(s).configured(), _create)]


@hookimpl
def roost_plugin_config_model() -> type[BaseModel]:
    """The ``[plugins."plugins.matrix"]`` table."""
    return MatrixConfig
