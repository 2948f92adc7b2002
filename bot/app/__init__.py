"""The running service: everything wired together (:mod:`.roost`) and the ``roost`` command
line (:mod:`.cli`).
"""
