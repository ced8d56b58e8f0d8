"""edgespec.server."""
