"""``--drafter beagle``: the Beagle cross-attention drafter, fed the target's last hidden states."""
from __future__ import annotations

from .base import FEATURE_LAST_HIDDEN, FeatureNeeds
from .learned import LearnedDrafter
from .learned_loading import open_learned

DEFAULT_CHECKPOINT = "beagle"


def from_options(options, server_info=None) -> LearnedDrafter:
    runtime, _, _ = open_learned("beagle", options, server_info, DEFAULT_CHECKPOINT)
    return LearnedDrafter("beagle", runtime, FeatureNeeds(FEATURE_LAST_HIDDEN), options.tree)
