"""``[plugins."plugins.matrix"]``: where the bot's Matrix account is and how it logs in."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, SecretStr

PLUGIN_NAME = "plugins.matrix"


class MatrixConfig(BaseModel):
    """``[plugins."plugins.matrix"]``: the Matrix channel (matrix-nio).

    The channel starts when ``homeserver``, ``user_id`` and a credential (an access
    token, or a password used once to log in) are set, usually through
    ``MATRIX_HOMESERVER``, ``MATRIX_USER_ID`` and ``MATRIX_ACCESS_TOKEN`` or
    ``MATRIX_PASSWORD`` in the environment.
    """

    model_config = ConfigDict(extra="forbid")

    homeserver: str | None = None
    """``MATRIX_HOMESERVER``: the client-server API's base URL (``https://matrix.example.org``)."""
    user_id: str | None = None
    """``MATRIX_USER_ID``: the bot's Matrix ID (``@roost:example.org``)."""
    access_token: SecretStr | None = None
    """``MATRIX_ACCESS_TOKEN``: the bot device's access token."""
    password: SecretStr | None = None
    """``MATRIX_PASSWORD``: used once to log in when no access token is set; the device's
    token is then kept in Roost's database (the channel's notes) and reused."""
    device_name: str = "Roost"
    """The display name of the device a password login creates."""
    sync_timeout: float = Field(30.0, gt=0, le=300)
    """Seconds a ``/sync`` long poll waits on the server for new events."""
    timeline_limit: int = Field(100, ge=1, le=1000)
    """Events per room one ``/sync`` answer may carry."""
    edit_interval: float = Field(1.0, ge=0)
    """Seconds between two edits of a streamed reply (``m.replace``)."""
    auto_join: bool = True
    """Accept invites as the DM and group policies allow (see the channel's docs)."""
    encryption: bool = True
    """Read and write end-to-end encrypted rooms when ``matrix-nio[e2e]`` is installed (the
    device's keys are kept under the data dir, in ``matrix/``); without it, or ``false``,
    the bot says once in an encrypted room that it cannot read it."""

    def configured(self) -> bool:
        """Whether the channel has what it needs to start."""
        return bool(self.homeserver and self.user_id
                    and (self.access_token is not None or self.password is not None))
