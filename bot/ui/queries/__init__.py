"""Read models of the Control UI's pages: SQL that runs on SQLite and PostgreSQL."""
