"""pluggy's plugin manager with a quicker look through a module plugin's names."""

from __future__ import annotations

import inspect
import types

import pluggy

__all__ = ["HookManager"]

_HOOKABLE = (types.FunctionType, staticmethod, classmethod, types.MethodType)
"""What pluggy takes as a hook implementation: functions and (static, class, bound) methods."""


class HookManager(pluggy.PluginManager):
    """A :class:`pluggy.PluginManager` that finds the same implementations, sooner.

    Registering a module makes pluggy look up every name in it (its imports too) with
    :func:`inspect.getattr_static`. A name whose value in the module's namespace is not
    a function or method cannot be an implementation, so it is passed over at once.
    """

    def parse_hookimpl_opts(self, plugin: object, name: str) -> pluggy.HookimplOpts | None:
        if inspect.ismodule(plugin):
            namespace = vars(plugin)
            if name in namespace and not isinstance(namespace[name], _HOOKABLE):
                return None
        return super().parse_hookimpl_opts(plugin, name)
