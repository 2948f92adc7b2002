"""Running the model's tool calls: the executor with timeouts, retries and breakers
(:mod:`.executor`), structured error extraction (:mod:`.structured_errors`) and argument
helpers for tool authors (:mod:`.args`).
"""
