"""Settings: ``roost.toml`` and ``ROOST_*`` variables loaded and validated
(:mod:`.settings`; ``roost.toml`` and ``.env`` as sources: :mod:`.sources`), secrets
masked for display (:mod:`.masking`), agents and their bindings (:mod:`.agents`),
token budgets (:mod:`.budgets`) and MCP servers (:mod:`.mcp`).
"""
