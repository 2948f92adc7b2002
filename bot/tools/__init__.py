"""Running the model's tool calls.

- :mod:`.executor`: :class:`~bot.tools.executor.ToolExecutor` runs one answer's
  calls as a batch, with timeouts, retries, breakers and cascades;
- :mod:`.classify`: is a tool's failure transient or permanent (the tool's view
  on :mod:`bot.resilience.retry`);
- :mod:`.breakers`: one :class:`~bot.resilience.breaker.CircuitBreaker` per tool,
  shared process-wide, and the tools' breaker policy;
- :mod:`.metrics`: counters per tool for ``/status``;
- :mod:`.outcomes`: how a call ended, the raw error for the error store, the
  texts about failures, the trace's decision records;
- :mod:`.dependencies`: which calls of a batch wait for which;
- :mod:`.args`: the executor's schema check and argument helpers for tool authors;
- :mod:`.structured_errors` and :mod:`.error_patterns`: structured facts (type,
  resources, next steps) pulled out of an error message.
"""
