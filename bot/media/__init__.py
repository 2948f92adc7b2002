"""Files people send and files Roost sends back: type sniffing (:mod:`.sniff`), image
checks and preparation for the model (:mod:`.images`), and the intake that stores
received files in the sender's workspace (:mod:`.intake`).

It sits with :mod:`bot.storage` in the layers: it may use the contracts, the
settings and :mod:`workspaces`, and channels may use it.
"""
