"""An MCP server that never starts: it complains on stderr and exits."""

import sys

print("broken: missing configuration", file=sys.stderr)
sys.exit(2)
