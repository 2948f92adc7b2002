"""From an accepted message to a delivered reply.

- :mod:`.dispatcher`: recording a message, running and delivering its turn, recovery;
- :mod:`.intake`: who is answered (DM and group policies, group chatter kept as context);
- :mod:`.lanes`: each session's runs and queue, and merging follow-ups;
- :mod:`.access`: the DM pairing gate; :mod:`.commands`: running a slash command;
- :mod:`.watch`: what a chat sees of a run's events (streamed text, notices);
- :mod:`.stream`: streaming a reply into a draft; :mod:`.redelivery`: replies sent again;
- :mod:`.registry`: the runs in flight (``/stop``).
"""
