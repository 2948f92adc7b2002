"""Roost core: the run engine, sessions, hooks and configuration."""

__version__ = "0.1.0"
