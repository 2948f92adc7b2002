"""Secrets kept out of what Roost shows: ``roost config show``, ``/config``, logs of settings.

Secret fields print as :data:`SECRET_MASK`; so do plugin settings whose key names a
secret and credentials inside URLs (``user:password@``, ``?token=``) whatever the
field. A configuration holding the mask itself (pasted back from that output) is
refused at load (:func:`find_mask`).
"""

from __future__ import annotations

import re
from typing import Any

SECRET_MASK = "********"

_SECRET_WORDS = ("token", "secret", "key", "password")


def mask_tree(value: Any, key: str = "") -> Any:
    """``value`` with every entry whose key names a secret masked, at any depth."""
    if isinstance(value, dict):
        return {k: mask_tree(v, k) for k, v in value.items()}
    if value and any(w in key.lower() for w in _SECRET_WORDS):
        return SECRET_MASK
    return value


def find_mask(tree: Any, where: str = "") -> str:
    """The dotted key of the first value in ``tree`` holding :data:`SECRET_MASK`, or ``""``."""
    if isinstance(tree, dict):
        for key, value in tree.items():
            found = find_mask(value, f"{where}.{key}" if where else str(key))
            if found:
                return found
    elif isinstance(tree, list):
        for n, value in enumerate(tree):
            found = find_mask(value, f"{where}[{n}]")
            if found:
                return found
    elif isinstance(tree, str) and SECRET_MASK in tree:
        return where or "(root)"
    return ""


# The scheme is bounded and must start a word, the user and password are bounded: unbounded,
# a long run of letters (a megabyte payload logged by an SDK) made every line quadratic.
_URL_USERINFO = re.compile(
    r"(?<![a-zA-Z0-9+.-])(?P<scheme>[a-zA-Z][a-zA-Z0-9+.-]{0,31}://)"
    r"(?P<user>[^/\s@:?#]{0,256})(?P<password>:[^/\s@]{0,256})?@")
SECRET_PARAM_WORDS = ("token", "secret", "key", "password", "passwd", "pwd", "auth",
                      "sig", "credential", "session")
"""A query parameter whose name holds one of these words has its value masked."""
_URL_SECRET_PARAM = re.compile(
    r"(?P<name>[?&;][^=&#\s?]{0,64}?(?:" + "|".join(SECRET_PARAM_WORDS) + r")[^=&#\s?]{0,64}=)"
    r"[^&#\s\"'<>]+", re.IGNORECASE)


def mask_text(text: str) -> str:
    """``text`` with credentials inside URLs masked: ``user:password@``, ``TOKEN@``, ``?key=``.

    The one function every output uses (``roost config show``, every CLI command's
    lines and errors, log records): the user of ``user:password@`` is kept, a lone
    ``user@`` (usually a token) and the value of every secret-named query parameter
    become :data:`SECRET_MASK`.
    """
    if "://" in text:
        text = _URL_USERINFO.sub(_userinfo, text)
    if "=" in text:
        text = _URL_SECRET_PARAM.sub(rf"\g<name>{SECRET_MASK}", text)
    return text


def _userinfo(match: re.Match[str]) -> str:
    if match["password"] is not None:
        return f"{match['scheme']}{match['user']}:{SECRET_MASK}@"
    return f"{match['scheme']}{SECRET_MASK}@"


def mask_urls(value: Any) -> Any:
    """``value`` with :func:`mask_text` applied to every string, at any depth."""
    if isinstance(value, str):
        return mask_text(value)
    if isinstance(value, dict):
        return {k: mask_urls(v) for k, v in value.items()}
    if isinstance(value, list):
        return [mask_urls(v) for v in value]
    return value
