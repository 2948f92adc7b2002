"""The Control UI's pages: every module here is one page family (``ROUTES``, ``NAV``)."""
