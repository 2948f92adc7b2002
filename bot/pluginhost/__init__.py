"""The pluggy plugin manager (:mod:`.manager`), which plugins an admin disabled
(:mod:`.state`) and installing plugin packages (:mod:`.install`).
"""
