"""Per-user workspaces: where they live, how they are seeded, and confinement.

Every user gets a private directory ``<workspaces_dir>/<channel>/<user_id>``
(see :func:`workspace_dir`), seeded once with the bootstrap templates by
:func:`ensure_workspace`. File tools reach files only through
:func:`resolve_in_workspace`, which refuses anything that lands outside.
"""

from workspaces.cache import read_cached
from workspaces.files import MAX_FILE_NAME, safe_file_name, store_file
from workspaces.paths import (
    MAX_COMPONENT_LENGTH,
    resolve_in_workspace,
    safe_component,
    workspace_dir,
)
from workspaces.seed import (
    FIRST_RUN_TEMPLATE,
    MEMORY_DIR,
    TEMPLATE_NAMES,
    ensure_workspace,
    forget_workspace,
    is_seeded,
    template_text,
)

__all__ = [
    "FIRST_RUN_TEMPLATE",
    "MAX_COMPONENT_LENGTH",
    "MAX_FILE_NAME",
    "MEMORY_DIR",
    "TEMPLATE_NAMES",
    "ensure_workspace",
    "forget_workspace",
    "is_seeded",
    "read_cached",
    "resolve_in_workspace",
    "safe_component",
    "safe_file_name",
    "store_file",
    "template_text",
    "workspace_dir",
]
