"""Persistence on SQLite or PostgreSQL: the schema steps (:mod:`.schema`),
the connection, applying them and group commit (:mod:`.db`; PostgreSQL's adapter in :mod:`.postgres`), sessions (:mod:`.sessions`), the
inbox/journal/outbox (:mod:`.inbox`), stored tool errors and large results
(:mod:`.errors`), plugins' own versioned tables (:mod:`.plugin_tables`), replicas' leases
on the inbox (:mod:`.claims`) and copying a database (:mod:`.copy`).
"""
