"""What crosses layers: message and LLM types, the tool, command, channel, provider and job
contracts, run events, the hook specifications and the services plugins receive.

Nothing here imports another part of ``bot``. Plugin authors reach these through the
public :mod:`roost` package.
"""
