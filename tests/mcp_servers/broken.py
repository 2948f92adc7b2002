"""An MCP server that never starts: it complains on stderr and exits."""

import sys


def main() -> None:
    """Complain and exit with code 2."""
    print("broken: missing configuration", file=sys.stderr)
    sys.exit(2)


if __name__ == "__main__":
    main()
