"""Identifiers for runs and spans: random and unique, not secret.

``uuid.uuid4()`` reads the kernel's random source on every call, a system call
each; a run made several (its id, one per span). These come from a generator
of this module, seeded from the kernel once, and again in a forked child so
the two processes do not hand out the same ids. Never use them as secrets
(tokens, pairing codes): that is what :mod:`secrets` is for.
"""

from __future__ import annotations

import os
import random

__all__ = ["hex_id"]

_rng = random.Random(os.urandom(32))


def _reseed() -> None:
    _rng.seed(os.urandom(32))


os.register_at_fork(after_in_child=_reseed)


def hex_id(chars: int = 32) -> str:
    """``chars`` random lowercase hex digits (32: as ``uuid.uuid4().hex``, 128 bits)."""
    return f"{_rng.getrandbits(chars * 4):0{chars}x}"
