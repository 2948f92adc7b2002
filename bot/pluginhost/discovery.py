"""pluggy's plugin manager with a quicker look through a module plugin's names."""

from __future__ import annotations

import inspect
import types
from typing import cast

import pluggy

__all__ = ["HookManager"]

_HOOKABLE = (types.FunctionType, staticmethod, classmethod, types.MethodType)
"""What pluggy takes as a hook implementation: functions and (static, class, bound) methods."""


class HookManager(pluggy.PluginManager):
    """A :class:`pluggy.PluginManager` that finds the same implementations, sooner.

    Registering a module makes pluggy look up every name in it (its imports too) with
    :func:`inspect.getattr_static`. A name whose value in the module's namespace is not
    a function or method cannot be an implementation, so it is passed over at once; a
    plain function there is what that lookup finds, so its marker is read off it directly.
    """

    def parse_hookimpl_opts(self, plugin: object, name: str) -> pluggy.HookimplOpts | None:
        if inspect.ismodule(plugin):
            namespace = vars(plugin)
            if name in namespace:
                value = namespace[name]
                if not isinstance(value, _HOOKABLE):
                    return None
                if (type(value) is types.FunctionType and type(plugin) is types.ModuleType
                        and not hasattr(types.ModuleType, name)):
                    opts = getattr(value, f"{self.project_name}_impl", None)
                    return cast(pluggy.HookimplOpts, opts) if isinstance(opts, dict) else None
        return super().parse_hookimpl_opts(plugin, name)
