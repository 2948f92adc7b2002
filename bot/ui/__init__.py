"""The Control UI (issue 29): pages under /ui/ served by the HTTP server."""
