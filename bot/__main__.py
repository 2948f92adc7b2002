"""``python -m bot`` runs the ``roost`` command line."""

from bot.app.cli import main

main()
