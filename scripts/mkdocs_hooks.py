"""MkDocs hooks: the configuration reference is generated from the settings models.

A page holding ``<!-- settings-reference -->`` gets one table per settings model
(the core ``Settings``, its nested tables, and every built-in plugin's config
model), each row read from the field itself: name, environment variable,
default and the field's docstring. Nothing in the table is written by hand.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import json
import pkgutil
import textwrap
from pathlib import Path
from typing import Any

from pydantic import AliasChoices, BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

MARKER = "<!-- settings-reference -->"
INTERNAL = {"config_file"}
"""Fields set by Roost itself, not by the operator."""


def field_docstrings(model: type[BaseModel]) -> dict[str, str]:
    """Each field's attribute docstring (the string right under it), by field name."""
    docs: dict[str, str] = {}
    for cls in reversed(model.__mro__):
        if not (isinstance(cls, type) and issubclass(cls, BaseModel)) or cls is BaseModel:
            continue
        try:
            source = textwrap.dedent(inspect.getsource(cls))
        except (OSError, TypeError):
            continue
        body = ast.parse(source).body[0]
        assert isinstance(body, ast.ClassDef)
        for node, after in zip(body.body, [*body.body[1:], None], strict=True):
            if (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
                    and isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant)
                    and isinstance(after.value.value, str)):
                docs[node.target.id] = inspect.cleandoc(after.value.value)
    return docs


def _default(info: FieldInfo) -> str:
    if info.default_factory is not None:
        value: Any = info.default_factory()  # type: ignore[call-arg]
    elif info.default is PydanticUndefined:
        return "required"
    else:
        value = info.default
    if isinstance(value, BaseModel):
        return "see below"
    if value is None or value in ({}, [], ()):
        return "unset"
    if isinstance(value, Path):
        value = str(value)
    return f"`{json.dumps(value, default=str)}`"


def _env_names(name: str, info: FieldInfo, prefix: str | None) -> str:
    names: list[str] = []
    alias = info.validation_alias
    if isinstance(alias, AliasChoices):
        names = [c for c in alias.choices if isinstance(c, str) and c.isupper()]
    if prefix is not None and f"{prefix}{name.upper()}" not in names:
        names.append(f"{prefix}{name.upper()}")
    return ", ".join(f"`{n}`" for n in names) or "-"


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|").replace("``", "`")


def model_table(model: type[BaseModel], table: str, prefix: str | None,
                plugin: str = "") -> str:
    """One Markdown table of ``model``'s fields (a plugin's: with the old names that map there)."""
    from bot.config.moved import MOVED, SERVICE_ENV, places

    was: dict[str, list[str]] = {}
    for old in MOVED:
        for owner, key in places(old):
            if owner == plugin:
                was.setdefault(key, []).extend([old, f"ROOST_{old.upper()}"])
    for env, (owner, key) in SERVICE_ENV.items():
        if owner == plugin:
            was.setdefault(key, []).append(env)
    docs = field_docstrings(model)
    rows = [f"### `{table}`" if table else "### Top level", ""]
    intro = inspect.getdoc(model)
    if intro:
        rows += [_cell(intro.split("\n\n")[0]), ""]
    env_head = " | environment" if prefix is not None else ""
    rows += [f"| setting{env_head} | default | meaning |",
             f"|---{'|---' if prefix is not None else ''}|---|---|"]
    for name, info in model.model_fields.items():
        if name in INTERNAL:
            continue
        env = f" | {_env_names(name, info, prefix)}" if prefix is not None else ""
        meaning = _cell(docs.get(name, ""))
        if name in was:
            meaning += " Also: " + ", ".join(f"`{n}`" for n in was[name]) + "."
        rows.append(f"| `{name}`{env} | {_default(info)} | {meaning} |")
    return "\n".join(rows) + "\n"


def plugin_models() -> list[tuple[str, type[BaseModel]]]:
    """The config model of every built-in plugin that declares one."""
    import plugins

    found = []
    for info in pkgutil.iter_modules(plugins.__path__, "plugins."):
        module = importlib.import_module(info.name)
        hook = getattr(module, "roost_plugin_config_model", None)
        model = hook() if callable(hook) else None
        if isinstance(model, type) and issubclass(model, BaseModel):
            found.append((info.name, model))
    return found


def reference() -> str:
    """The whole generated reference: the core settings, nested tables, plugins'."""
    from bot.config.agents import AgentConfig, Binding, JudgeConfig, PatternConfig
    from bot.config.budgets import BudgetConfig, ModelPrice
    from bot.config.mcp import McpServerConfig
    from bot.config.settings import Settings

    parts = [model_table(Settings, "", "ROOST_")]
    for table, model in [("[budgets]", BudgetConfig), ("[budgets.prices.<model>]", ModelPrice),
                         ("[agents.<name>]", AgentConfig), ("[agents.<name>.judge]", JudgeConfig),
                         ("[agents.<name>.patterns]", PatternConfig), ("[[bindings]]", Binding),
                         ("[mcp.servers.<name>]", McpServerConfig)]:
        parts.append(model_table(model, table, None))
    for name, model in plugin_models():
        parts.append(model_table(model, f'[plugins."{name}"]', None, name))
    return "\n".join(parts)


def on_page_markdown(markdown: str, **_: Any) -> str:
    """Replace the marker with the generated reference."""
    return markdown.replace(MARKER, reference()) if MARKER in markdown else markdown
