"""Persistence on SQLite or PostgreSQL.

The schema steps (:mod:`.schema`); the connection, applying the steps and group
commit (:mod:`.db`; PostgreSQL's adapter in :mod:`.postgres`); sessions
(:mod:`.sessions`); the inbox/journal/outbox (:mod:`.inbox`); stored tool errors
and large results (:mod:`.errors`); plugins' own versioned tables
(:mod:`.plugin_tables`); replicas' leases on the inbox (:mod:`.claims`), their
leader (:mod:`.leader`) and control channel (:mod:`.control`); copying a
database (:mod:`.copy`).
"""
