"""The Control UI (issue 29)."""
