"""The Control UI at ``/ui`` (server-rendered pages, htmx, Server-Sent Events).

Imports nothing: :mod:`bot.app.ui_mount` loads :mod:`bot.ui.server` on the first
request to ``/ui``, so a UI never opened costs nothing. Pages are the modules of
:mod:`bot.ui.pages`, written against :mod:`bot.ui.kit`.
"""
