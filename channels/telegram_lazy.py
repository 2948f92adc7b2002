"""Import aiogram without building a validator for each of its types up front.

``aiogram.types`` ends by calling ``model_rebuild()`` on every Bot API type
it defines. With pydantic 2 that builds a separate core schema for each, and
each schema inlines everything its type can contain (bench/README.md has the
import's cost). The types are already declared ``defer_build=True``; only that
loop forces the work.

This module imports aiogram with the loop's rebuilds skipped, keeping the
namespace it passed, and lets each type build itself the first time it is
used, with that namespace (pydantic rebuilds a deferred model on first use
through ``model_rebuild``, which is overridden on aiogram's two model bases
to supply it). Roost uses a handful of types, so it pays for those only.

Import it before anything imports aiogram. If aiogram was already imported,
or a future version no longer has the loop, nothing is changed and aiogram
behaves as it always does.
"""

from __future__ import annotations

import sys
from typing import Any

import pydantic

__all__ = ["LAZY"]


def _import_lazily() -> bool:
    if "aiogram" in sys.modules:
        return False
    original = pydantic.BaseModel.__dict__["model_rebuild"]
    rebuild = original.__func__
    captured: dict[str, Any] = {}

    def skip_aiogram(cls: type[pydantic.BaseModel], *, force: bool = False,
                     raise_errors: bool = True, _parent_namespace_depth: int = 2,
                     _types_namespace: Any = None) -> bool | None:
        # Only the loop in aiogram.types passes the namespace of every type;
        # pydantic's own calls (generic methods) go through untouched.
        if cls.__module__.startswith("aiogram.") and _types_namespace is not None \
                and "Update" in _types_namespace and "Message" in _types_namespace:
            captured["namespace"] = _types_namespace
            return None
        return rebuild(cls, force=force, raise_errors=raise_errors,  # type: ignore[no-any-return]
                       _parent_namespace_depth=_parent_namespace_depth + 1,
                       _types_namespace=_types_namespace)

    pydantic.BaseModel.model_rebuild = classmethod(skip_aiogram)  # type: ignore[method-assign,assignment]
    try:
        import aiogram  # noqa: F401 - imported here, with the rebuilds skipped
        from aiogram.client.context_controller import BotContextController
        from aiogram.methods.base import Response
    finally:
        setattr(pydantic.BaseModel, "model_rebuild", original)  # noqa: B010
    namespace = captured.get("namespace")
    if namespace is None:
        return False

    def with_namespace(cls: type[pydantic.BaseModel], *, force: bool = False,
                       raise_errors: bool = True, _parent_namespace_depth: int = 2,
                       _types_namespace: Any = None) -> bool | None:
        return rebuild(cls, force=force, raise_errors=raise_errors,  # type: ignore[no-any-return]
                       _parent_namespace_depth=_parent_namespace_depth + 1,
                       _types_namespace=namespace if _types_namespace is None
                       else _types_namespace)

    # Every aiogram type and method derives from BotContextController; API
    # responses are Response[...] models.
    for base in (BotContextController, Response):
        setattr(base, "model_rebuild", classmethod(with_namespace))  # noqa: B010
    return True


LAZY = _import_lazily()
"""Whether aiogram's types are built on first use (``False``: aiogram as usual)."""
