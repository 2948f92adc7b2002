"""Per-user workspaces: where they live, how they are seeded, and confinement.

Every user gets a private directory ``<workspaces_dir>/<channel>/<user_id>``
(see :func:`workspace_dir`), seeded once with the bootstrap templates by
:func:`ensure_workspace`. Files in it are reached only through
:class:`WorkspaceRoot` (:mod:`workspaces.root`): each path is opened once below
the workspace with no link followed at open (:mod:`workspaces.beneath`), and
the caller works on the descriptor. :func:`resolve_in_workspace` only checks a
path (for code that must hand a path to a library that opens it itself);
such code holds :func:`workspace_lock`, which ``exec`` holds too.
"""

from workspaces.exclusive import workspace_lock
from workspaces.files import MAX_FILE_NAME, safe_file_name, store_file
from workspaces.paths import (
    MAX_COMPONENT_LENGTH,
    resolve_in_workspace,
    safe_component,
    workspace_dir,
)
from workspaces.root import WorkspaceRoot, read_cached, user_parts
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
    "WorkspaceRoot",
    "ensure_workspace",
    "forget_workspace",
    "is_seeded",
    "read_cached",
    "resolve_in_workspace",
    "safe_component",
    "safe_file_name",
    "store_file",
    "template_text",
    "user_parts",
    "workspace_dir",
    "workspace_lock",
]
