"""Settings: ``roost.toml`` and ``ROOST_*`` variables loaded and validated
(:mod:`.settings`), agents and their bindings (:mod:`.agents`).
"""
