"""``python -m bot`` runs the ``roost`` command line."""

from bot.cli import main

main()
