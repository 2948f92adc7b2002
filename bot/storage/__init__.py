"""SQLite persistence: the connection, migrations and group commit (:mod:`.db`), sessions
(:mod:`.sessions`), the inbox/journal/outbox (:mod:`.inbox`), stored tool errors and
large results (:mod:`.errors`), plugins' own versioned tables (:mod:`.plugin_tables`).
"""
