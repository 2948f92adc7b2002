"""From an accepted message to a delivered reply.

- :mod:`.dispatcher`: recording a message, running its turn, committing and delivering it,
  recovery;
- :mod:`.intake`: who is answered (DM and group policies, DM pairing, group chatter kept
  as context);
- :mod:`.lanes`: each session's runs and queue, merging follow-ups, the runs in flight
  (``/stop``);
- :mod:`.delivery`: what a chat sees of a run (streamed draft, notices), its commit, the
  reply handed to the platform and handed again;
- :mod:`.commands`: running a slash command; :mod:`.replicas`: sessions over replicas.
"""
