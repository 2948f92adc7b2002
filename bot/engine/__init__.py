"""One run: think, act, observe.

- :mod:`.run_engine`: what all runs share (provider, plugin state, breakers, compactor;
  the agents it is handed); it starts runs and announces their endings;
- :mod:`.runloop`: the run itself (input checks, prompt, model calls, how it ends);
- :mod:`.tool_turns`: the tool side of a run (calls, execution summary, loop warnings);
- :mod:`.requests`: :class:`RunRequest`, the plugin state a run takes, :class:`RunResult`;
- :mod:`.context`: what a request is built from (system prompt, history pipeline,
  segments, token estimates); :mod:`.compaction`: summarizing old history;
  :mod:`.media`: files a message brought; :mod:`.exec_summary`: what tools did;
- :mod:`.gates`: who is answered and how (the gate chain, the input guard);
  :mod:`.budgets`: token budgets and the request rate; :mod:`.judging`: judged replies.
"""
