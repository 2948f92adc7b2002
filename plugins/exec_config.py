"""The exec plugin's settings: its ``[plugins."plugins.exec_tool"]`` table."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from roost import Settings

PLUGIN_NAME = "plugins.exec_tool"


class ExecConfig(BaseModel):
    """``[plugins."plugins.exec_tool"]``: the sandboxed ``exec`` tool (``exec_*`` before)."""

    model_config = ConfigDict(extra="forbid")

    bwrap: str = "bwrap"
    """The bubblewrap binary (a name on PATH or a path); exec refuses to run without it."""
    timeout: float = Field(30.0, gt=0)
    """Wall-clock seconds a command may run when the model asks for no ``timeout``."""
    max_timeout: float = Field(300.0, gt=0)
    """The longest ``timeout`` the model may ask for."""
    cpu_seconds: int = Field(60, ge=1)
    """CPU seconds of each process in the sandbox (RLIMIT_CPU)."""
    memory_mb: int = Field(1024, ge=64)
    """Address space of each process in the sandbox (RLIMIT_AS)."""
    max_processes: int = Field(64, ge=4)
    """Processes and threads the sandbox may add (RLIMIT_NPROC): fork bombs stop here."""
    max_file_mb: int = Field(100, ge=1)
    """The largest file a sandboxed command may write (RLIMIT_FSIZE)."""
    max_output_bytes: int = Field(200_000, ge=1_000)
    """Output read from a command; past it the command is stopped."""
    network_agents: list[str] = Field(default_factory=list)
    """Agents whose commands may reach the network (comma-separated in the env); none by
    default."""
    uid: int = Field(65534, ge=1)
    """When Roost runs as root, commands run as this uid and gid (root ignores process
    limits)."""

    @field_validator("network_agents", mode="before")
    @classmethod
    def _split(cls, value: Any) -> Any:
        if isinstance(value, str):
            return [part.strip() for part in value.split(",") if part.strip()]
        return value


def exec_config(settings: Settings) -> ExecConfig:
    """The exec table of ``settings`` (defaults where it is absent); raises on a bad value."""
    return ExecConfig.model_validate(settings.plugins.get(PLUGIN_NAME) or {})
