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


# The scheme is bounded: an unbounded one makes a long run of letters quadratic.
_URL_USERINFO = re.compile(r"(?P<scheme>\b[a-zA-Z][a-zA-Z0-9+.-]{0,31}://)"
                           r"(?P<user>[^/\s@:]*)(?P<password>:[^/\s@]*)?@")
_URL_SECRET_PARAM = re.compile(
    r"(?P<name>[?&][^=&#\s]*(?:token|secret|key|password|auth)[^=&#\s]*=)[^&#\s]+",
    re.IGNORECASE)


def _mask_url_text(text: str) -> str:
    def userinfo(match: re.Match[str]) -> str:
        # user:password@ keeps the user (it helps to see which account); a lone
        # user@ is usually a token (https://TOKEN@host), so it is masked whole.
        if match["password"] is not None:
            return f"{match['scheme']}{match['user']}:{SECRET_MASK}@"
        return f"{match['scheme']}{SECRET_MASK}@"

    text = _URL_USERINFO.sub(userinfo, text)
    return _URL_SECRET_PARAM.sub(rf"\g<name>{SECRET_MASK}", text)


def mask_urls(value: Any) -> Any:
    """``value`` with credentials inside URLs masked, at any depth."""
    if isinstance(value, str):
        return _mask_url_text(value) if "://" in value else value
    if isinstance(value, dict):
        return {k: mask_urls(v) for k, v in value.items()}
    if isinstance(value, list):
        return [mask_urls(v) for v in value]
    return value
