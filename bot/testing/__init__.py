"""Local fake platform and LLM servers for testing Roost and Roost plugins.

They speak the real wire protocols on 127.0.0.1 so the real client libraries
(aiogram, discord.py, slack-bolt, anthropic) can be driven against them. The
pytest fixtures (``fake_telegram``, ``fake_discord``, ``fake_slack``,
``fake_anthropic``) are registered through the ``pytest11`` entry point;
they need the ``dev`` (or ``testing``) extra for aiohttp.
"""
