"""Roost's built-in plugins. Each module registers through the same hooks as external packages."""
