"""Agents: resolving an agent's provider, tools and judges (:mod:`.router`), tool policies
(:mod:`.tool_policy`), judges and self-correction (:mod:`.judge`) and the pattern
library (:mod:`.patterns`).
"""
