"""The ``roost`` command line.

:mod:`.base` holds the group and its helpers; :mod:`.serve` ``run``; :mod:`.chat`
``chat``; :mod:`.plugins` ``plugins``; :mod:`.admin` ``config``, ``mcp``,
``errors``, ``pairing``, ``status`` and ``init``; :mod:`.db` ``db`` (migrate, copy);
:mod:`.ui` ``ui`` (the Control UI's accounts); :mod:`.skills` ``skills`` and
``patterns``.
"""

from bot.app.cli import admin, chat, db, plugins, serve, skills, ui
from bot.app.cli.base import cli, main

# Imported for their commands, which register on ``cli``.
__all__ = ["admin", "chat", "cli", "db", "main", "plugins", "serve", "skills", "ui"]
