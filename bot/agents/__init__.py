"""Agents: routing a chat to its agent and resolving the agent's provider, tools and
judges (:mod:`.router`; the app builds the router and hands it to the dispatcher and
the engine), tool policies (:mod:`.tool_policy`), judges and self-correction
(:mod:`.judge`) and the pattern library (:mod:`.patterns`).
"""
