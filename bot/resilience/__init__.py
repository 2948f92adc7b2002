"""Failure policy shared by every layer: the provider circuit breaker (:mod:`.breaker`).
"""
