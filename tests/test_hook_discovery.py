"""bot.pluginhost.discovery.HookManager finds exactly the implementations pluggy finds."""

from __future__ import annotations

import importlib
import types

import pluggy

from bot.contracts import hookspecs
from bot.contracts.hookspecs import hookimpl
from bot.pluginhost.discovery import HookManager
from bot.pluginhost.manager import BUILTIN_PLUGINS


def found(manager: pluggy.PluginManager, plugin: object) -> list[tuple[str, str]]:
    manager.add_hookspecs(hookspecs)
    manager.register(plugin)
    return sorted((caller.name, impl.function.__qualname__)
                  for caller in manager.get_hookcallers(plugin) or []
                  for impl in caller.get_hookimpls())


def test_every_built_in_plugin_and_the_example_register_the_same_implementations() -> None:
    names = [*BUILTIN_PLUGINS, "roost_plugin_example"]
    for module in map(importlib.import_module, names):
        expected = found(pluggy.PluginManager(hookspecs.PROJECT_NAME), module)
        assert expected, module.__name__
        assert found(HookManager(hookspecs.PROJECT_NAME), module) == expected, module.__name__


def test_implementations_held_as_static_class_and_bound_methods_are_found() -> None:
    class Holder:
        @staticmethod
        @hookimpl
        def roost_tools() -> list[object]:
            return []

        @classmethod
        @hookimpl
        def roost_commands(cls) -> list[object]:
            return []

        @hookimpl
        def roost_guard_patterns(self) -> list[object]:
            return []

    module = types.ModuleType("plugin_of_aliases")
    module.roost_tools = Holder.roost_tools  # type: ignore[attr-defined]
    module.roost_commands = Holder.roost_commands  # type: ignore[attr-defined]
    module.roost_guard_patterns = Holder().roost_guard_patterns  # type: ignore[attr-defined]
    module.not_a_hook = 3  # type: ignore[attr-defined]
    for plugin in (module, Holder(), Holder):
        expected = found(pluggy.PluginManager(hookspecs.PROJECT_NAME), plugin)
        assert found(HookManager(hookspecs.PROJECT_NAME), plugin) == expected
    assert {name for name, _ in found(HookManager(hookspecs.PROJECT_NAME), module)} == {
        "roost_tools", "roost_commands", "roost_guard_patterns"}


def test_plain_functions_of_a_module_give_pluggys_options_and_a_module_type_descriptor_wins(
        ) -> None:
    @hookimpl(tryfirst=True)
    def roost_tools() -> list[object]:
        return []

    def roost_commands() -> list[object]:
        return []

    roost_commands.roost_impl = "not options"  # type: ignore[attr-defined]

    class Special(types.ModuleType):
        @property
        def roost_guard_patterns(self) -> list[object]:
            raise AssertionError("a descriptor is never run")

    def options(manager: pluggy.PluginManager, plugin: object) -> list[tuple[str, object]]:
        manager.add_hookspecs(hookspecs)
        manager.register(plugin)
        return sorted((caller.name, sorted(impl.opts.items()))
                      for caller in manager.get_hookcallers(plugin) or []
                      for impl in caller.get_hookimpls())

    for module in (types.ModuleType("plain"), Special("special")):
        module.roost_tools = roost_tools  # type: ignore[attr-defined]
        module.roost_commands = roost_commands  # type: ignore[attr-defined]
        vars(module)["roost_guard_patterns"] = roost_tools  # Special's property shadows it
        expected = options(pluggy.PluginManager(hookspecs.PROJECT_NAME), module)
        assert options(HookManager(hookspecs.PROJECT_NAME), module) == expected
        assert [name for name, _ in expected] == (
            ["roost_guard_patterns", "roost_tools"] if type(module) is types.ModuleType
            else ["roost_tools"])
