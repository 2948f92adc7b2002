"""One run: think, act, observe (:mod:`.runloop`), with the context pipeline
(:mod:`.context`, :mod:`.history`, :mod:`.tokens`, :mod:`.compaction`,
:mod:`.exec_summary`), the input guard (:mod:`.guard`) and the plugin snapshot a run
captures (:mod:`.snapshot`).
"""
