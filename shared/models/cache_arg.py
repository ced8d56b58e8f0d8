"""The old name of ``edgespec.shared.kv``'s cache-argument helpers, kept only while server/training/ (its features
and answer capture) still imports them from here; nothing else does. Remove it once training imports
``edgespec.shared.kv``."""
from edgespec.shared.kv import cache_kwarg, output_cache, with_cache

__all__ = ["cache_kwarg", "output_cache", "with_cache"]
