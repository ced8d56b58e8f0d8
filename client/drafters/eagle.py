"""``--drafter eagle``: the EAGLE-2 head, fed the target's last hidden states."""
from __future__ import annotations

from .base import FEATURE_LAST_HIDDEN, FeatureNeeds
from .learned import LearnedDrafter
from .learned_loading import open_learned

DEFAULT_CHECKPOINT = "eagle"


def from_options(options, server_info=None) -> LearnedDrafter:
    runtime, _, _ = open_learned("eagle", options, server_info, DEFAULT_CHECKPOINT)
    return LearnedDrafter("eagle", runtime, FeatureNeeds(FEATURE_LAST_HIDDEN), options.tree)
