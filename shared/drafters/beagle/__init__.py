"""Beagle: a cross-attention drafter (``model``) and its training masks (``masks``, which only the recipe uses).
Its drafting runtime is ``edgespec.client.drafters.learned.beagle_runtime``. Imports nothing, so opening one
module of the family loads no other."""
