"""From an accepted message to a delivered reply: per-session lanes, merging, streaming,
redelivery and recovery (:mod:`.dispatcher`), and the runs in flight (:mod:`.registry`).
"""
