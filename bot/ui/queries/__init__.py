"""Read models of the Control UI's pages: typed rows from the store, on SQLite and PostgreSQL."""
