"""Failure policy shared by every layer (and by channels and plugins).

- :mod:`.retry`: the one retry policy (attempts, exponential backoff with
  jitter, caps, a server's ``retry-after``, fixed schedules) and the one error
  classifier (transient, rate-limited or permanent, from statuses, codes,
  exception types and text);
- :mod:`.breaker`: the one circuit breaker type, in front of model providers
  (callers wait) and of each tool (callers fail fast).
"""
