"""``python -m edgespec``: the `edgespec` command."""
import sys

from edgespec.cli import main

sys.exit(main())
