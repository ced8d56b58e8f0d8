"""edgespec.client."""
