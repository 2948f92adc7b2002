"""Roost's core. The layers, lowest first (import-linter enforces the order):

- :mod:`bot.observability`, :mod:`bot.resilience`: tracing, redaction, failure policy;
- :mod:`bot.contracts`, :mod:`bot.config`: the types that cross layers, and settings;
- :mod:`bot.storage`: SQLite persistence;
- :mod:`bot.pluginhost`: the plugin manager;
- :mod:`bot.tools`, :mod:`bot.agents`: tool execution; agents, policies and judges;
- :mod:`bot.engine`: one run (think, act, observe) and its context;
- :mod:`bot.dispatch`, :mod:`bot.scheduling`: messages to runs to replies; scheduled jobs;
- :mod:`bot.app`: the service wired together and the command line.

:mod:`bot.testing` holds the fake platforms and fixtures tests and benches use.
Plugin authors import from :mod:`roost`, not from here.
"""

__version__ = "0.1.0"
