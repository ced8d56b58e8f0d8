"""edgespec.netem."""
