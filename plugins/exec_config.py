"""The exec plugin's settings: its ``[plugins."plugins.exec_tool"]`` table."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from plugins.exec_uids import RESERVED_UIDS
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
    uid: int = Field(70000, ge=1)
    """When Roost runs as root (root ignores process limits), the first uid of the
    sandboxes' pool: each running command claims one of ``uid`` to ``uid + uids - 1`` (as
    its uid and gid) for itself alone, host-wide, so one sandbox's processes never count
    against another's limit. The default range (70000-70063) is where no account is made:
    past distributions' users (to 60000), systemd's dynamic users (to 65519) and ``nobody``,
    before subordinate ids (``/etc/subuid``, from 100000). Nothing else may use these uids."""
    uids: int = Field(64, ge=1)
    """How many uids the pool has: the commands that may run at once on this host, every
    Roost process on it sharing the pool; one more waits for a free uid."""
    uid_wait: float = Field(30.0, ge=0)
    """Seconds a command waits for a free uid (at most what the run's time left spares
    beside its timeout; ``/stop`` ends the wait) before exec refuses it as busy."""

    @model_validator(mode="after")
    def _clear_of_minus_one(self) -> ExecConfig:
        last = self.uid + self.uids - 1
        if last > 2**32 - 1:
            raise ValueError(f"the sandbox uids {self.uid}-{last} (uid, uids) pass 2^32")
        if all(uid in RESERVED_UIDS for uid in range(self.uid, last + 1)):
            raise ValueError(
                f"the sandbox uids {self.uid}-{last} (uid, uids) are only (uid_t) -1 to the "
                "kernel or to 16-bit programs; choose another (the default starts at 70000)")
        return self

    @field_validator("network_agents", mode="before")
    @classmethod
    def _split(cls, value: Any) -> Any:
        if isinstance(value, str):
            return [part.strip() for part in value.split(",") if part.strip()]
        return value


def exec_config(settings: Settings) -> ExecConfig:
    """The exec table of ``settings`` (defaults where it is absent); raises on a bad value."""
    return ExecConfig.model_validate(settings.plugins.get(PLUGIN_NAME) or {})
