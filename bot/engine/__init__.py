"""One run: think, act, observe.

- :mod:`.runloop`: the run itself (input checks, prompt, model calls, tools);
- :mod:`.finish`: how a run ends (completed, refused, failed, cancelled: the one commit);
- :mod:`.run_engine`: what all runs share (provider, plugin snapshot, breakers, compactor;
  the agents it is handed);
- :mod:`.requests`: :class:`RunRequest` and :class:`RunResult`;
- :mod:`.llm_call`: one model call with its streamed text;
- :mod:`.judging`: the reply judged and corrected, each verdict a span;
- the context pipeline: :mod:`.context`, :mod:`.history`, :mod:`.tokens`,
  :mod:`.compaction`, :mod:`.exec_summary`, :mod:`.media` (files a message brought);
- :mod:`.guard`: the input guard; :mod:`.snapshot`: the plugin state a run captures;
  :mod:`.turns`: small helpers (workspace path, what the model sees of a message).
"""
