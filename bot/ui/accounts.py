"""Passwords, session tokens and login throttling for the Control UI.

Passwords are hashed with scrypt (stdlib :func:`hashlib.scrypt`, a random salt per
password, the cost stored with the hash) and compared in constant time. A login
session is a random token in an HttpOnly cookie; the database keeps only its
SHA-256, so a copy of the database logs nobody in.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import hmac
import secrets
import time
from collections import deque
from collections.abc import Callable

SCRYPT_N, SCRYPT_R, SCRYPT_P = 1 << 14, 8, 1
"""scrypt's cost for every password Roost hashes: 16 MiB of memory per hash."""
SALT_BYTES = 16
KEY_BYTES = 32



def hash_password(password: str, *, n: int = SCRYPT_N, r: int = SCRYPT_R,
                  p: int = SCRYPT_P) -> str:
    """``scrypt$N$r$p$salt$key`` (base64) of ``password`` with a fresh salt.

    The product always hashes at the default cost; a lower one is for test accounts
    (:func:`verify_password` reads the cost from the stored hash).
    """
    salt = secrets.token_bytes(SALT_BYTES)
    key = hashlib.scrypt(password.encode(), salt=salt, n=n, r=r, p=p, dklen=KEY_BYTES)
    return "$".join(["scrypt", str(n), str(r), str(p),
                     base64.b64encode(salt).decode(), base64.b64encode(key).decode()])


def verify_password(password: str, stored: str | None) -> bool:
    """Whether ``password`` matches ``stored``; ``None`` (no account) costs as much and fails."""
    if stored is None:
        stored, known = _dummy_hash(), False
    else:
        known = True
    try:
        scheme, n, r, p, salt, key = stored.split("$")
        if scheme != "scrypt":
            return False
        expected = base64.b64decode(key)
        got = hashlib.scrypt(password.encode(), salt=base64.b64decode(salt), n=int(n),
                             r=int(r), p=int(p), dklen=len(expected))
    except (ValueError, TypeError):
        return False
    return hmac.compare_digest(got, expected) and known


@functools.cache
def _dummy_hash() -> str:
    """A hash checked when the account does not exist, so both cases take as long."""
    return hash_password(secrets.token_hex(8))


def new_token() -> str:
    """A fresh secret for a session cookie or a CSRF token (256 bits, URL-safe)."""
    return secrets.token_urlsafe(32)


def token_hash(token: str) -> str:
    """What the database keeps of a session token: its SHA-256 in hex."""
    return hashlib.sha256(token.encode()).hexdigest()


def same_token(given: str, expected: str) -> bool:
    """Constant-time comparison of two tokens."""
    return hmac.compare_digest(given.encode(), expected.encode())


class Throttle:
    """Failed logins per key (an address, an account) within a sliding window.

    A key with ``limit`` failures in the last ``window`` seconds is refused until
    the oldest of them leaves the window. At most ``keys`` keys are tracked; past
    that the one idle longest is forgotten.
    """

    def __init__(self, limit: int, window: float, *, keys: int = 10_000,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.limit = limit
        self.window = window
        self.keys = keys
        self.clock = clock
        self._failures: dict[str, deque[float]] = {}

    def wait(self, key: str) -> float:
        """Seconds until ``key`` may try again; 0 if it may now."""
        stamps = self._failures.get(key)
        if not stamps:
            return 0.0
        now = self.clock()
        while stamps and stamps[0] <= now - self.window:
            stamps.popleft()
        if len(stamps) < self.limit:
            if not stamps:
                del self._failures[key]
            return 0.0
        return stamps[0] + self.window - now

    def failed(self, key: str) -> None:
        """Count one failure of ``key``."""
        stamps = self._failures.pop(key, None) or deque(maxlen=self.limit)
        stamps.append(self.clock())
        self._failures[key] = stamps  # re-inserted: the dict's order is by last failure
        while len(self._failures) > self.keys:
            del self._failures[next(iter(self._failures))]

    def forgive(self, key: str) -> None:
        """Take back one counted failure of ``key`` (the attempt succeeded)."""
        stamps = self._failures.get(key)
        if stamps:
            stamps.pop()
            if not stamps:
                del self._failures[key]

    def clear(self, key: str) -> None:
        """Forget ``key``'s failures (it logged in)."""
        self._failures.pop(key, None)
