"""The access page: pairing requests, paired users, the allowlist and the admins; and
its actions, which call what ``/pair`` and ``roost pairing`` call.

Approving a code records the user as paired (:meth:`AccessStore.approve`) and tells
every replica to forget its cached approvals, as ``/pair approve`` does; the user's
next DM is then answered. Denying a code refuses it (the user's next DM gets a new
one); revoking forgets a paired user.
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

from bot.contracts.messages import OutboundMessage
from bot.storage.access import AccessStore, PairedUser, PairingRequest
from bot.ui.queries.opsdb import PAGE_SIZE, make_pair_cursor, pair_cursor, rows

if TYPE_CHECKING:
    from bot.app.roost import Roost

log = logging.getLogger("roost.ui.access")

APPROVED_NOTICE = "An admin approved you: you can talk to me now. Send your message again."
"""What the approved user is told (a courtesy: the approval stands if it cannot be sent)."""


class AccessUnavailable(RuntimeError):
    """The app runs without the pairing store."""


@dataclass(frozen=True, slots=True)
class AccessPage:
    """Pending requests (oldest first), a page of paired users (newest first), and the
    allowlist, admins and DM policy from the settings."""

    pending: list[PairingRequest]
    paired: list[PairedUser]
    next_cursor: str | None
    allowlist: list[str]
    admins: list[str]
    dm_policy: str
    dm_policies: dict[str, str]


def access_store(app: Roost) -> AccessStore:
    """The app's pairing store; :class:`AccessUnavailable` without one."""
    store = app.services.access
    if not isinstance(store, AccessStore):
        raise AccessUnavailable("the pairing store is not set up")
    return store


async def access_page(app: Roost, *, before: str | None = None,
                      limit: int = PAGE_SIZE) -> AccessPage:
    """The access page; ``before``: the cursor of the paired users' next page."""
    store = access_store(app)
    cursor = pair_cursor(before)
    where: str = ""
    params: tuple[object, ...] = ()
    if cursor is not None:
        channel, _, user_id = cursor[1].partition(":")
        where = " WHERE (approved_at, channel, user_id) < (?, ?, ?)"
        params = (cursor[0], channel, user_id)
    # Newest first by the paired_users_approved index.
    found = await rows(
        app.store,
        "SELECT channel, user_id, display_name, approved_by, approved_at FROM paired_users"
        f"{where} ORDER BY approved_at DESC, channel DESC, user_id DESC LIMIT ?",
        (*params, limit + 1))
    paired = [PairedUser(str(r[0]), str(r[1]), str(r[2]), str(r[3]), float(r[4]))
              for r in found[:limit]]
    more = len(found) > limit
    settings = app.settings
    return AccessPage(
        await store.pending(), paired,
        make_pair_cursor(paired[-1].approved_at, paired[-1].user) if more else None,
        list(settings.dm_allowlist), list(settings.admins), settings.dm_policy,
        dict(settings.dm_policies))


async def approve(app: Roost, code: str, by: str) -> PairingRequest | None:
    """Approve pairing ``code`` as ``by``; the request, or ``None`` when no valid one has it."""
    request = await access_store(app).approve(code, by)
    await app.runtime.invalidate_everywhere("pairing")
    if request is None:
        return None
    log.info("%s approved %s for DMs", by, request.user)
    with contextlib.suppress(Exception):
        await app.runtime.deliver(OutboundMessage(request.channel, request.chat_id,
                                                  APPROVED_NOTICE, kind="notice"))
    return request


async def deny(app: Roost, code: str, by: str) -> bool:
    """Refuse pairing ``code``; whether it was pending."""
    denied = await access_store(app).deny(code)
    if denied:
        log.info("%s denied pairing code %s", by, code)
    return denied


async def revoke(app: Roost, user: str, by: str) -> bool:
    """Forget paired ``user`` (``channel:user_id``); whether they were paired."""
    channel, sep, user_id = user.partition(":")
    if not sep or not channel or not user_id:
        return False
    revoked = await access_store(app).revoke(channel, user_id)
    await app.runtime.invalidate_everywhere("pairing")  # replicas forget their cached approval
    if revoked:
        log.info("%s revoked %s", by, user)
    return revoked
