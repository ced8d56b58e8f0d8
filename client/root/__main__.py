"""``python -m edgespec``: the `edgespec` command."""
import sys

from edgespec.cli import entry

sys.exit(entry())
