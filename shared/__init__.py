"""What both sides of edgespec need: trees, codecs, fingerprints, models."""

__version__ = "0.1.0"
