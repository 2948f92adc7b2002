"""The memory plugin's settings: its ``[plugins."plugins.memory"]`` table."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from roost import Settings

PLUGIN_NAME = "plugins.memory"


class MemoryConfig(BaseModel):
    """``[plugins."plugins.memory"]``: the scheduled memory flush (``memory_flush_*`` before)
    and the largest memory file read (``max_file_bytes`` before, shared with the file tools).

    The flush itself is switched by the core's ``memory_flush``, which compaction reads too.
    """

    model_config = ConfigDict(extra="forbid")

    flush_every_hours: float = Field(6.0, gt=0)
    """How often idle sessions get a scheduled memory flush."""
    flush_idle_minutes: float = Field(30.0, gt=0)
    """A session idle this long is due for the scheduled flush."""
    flush_min_messages: int = Field(10, ge=1)
    """Unsaved messages a session needs for the scheduled flush."""
    max_file_bytes: int = Field(1_000_000, ge=1)
    """The largest memory file ``memory_get`` reads and the index takes in."""


def memory_config(settings: Settings) -> MemoryConfig:
    """The memory table of ``settings`` (defaults where absent); raises on a bad value."""
    return MemoryConfig.model_validate(settings.plugins.get(PLUGIN_NAME) or {})
