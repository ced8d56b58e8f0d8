"""Learned drafter models (EAGLE-2 head, Mixture of Attentions) and their parts.

Models and checkpoints: ``eagle`` (EagleHead), ``moa`` (MoAClient + the server's
``lsa.LayerSelfAttention``), ``checkpoint`` (safetensors files), ``vocab`` (reduced draft
vocabulary). Drafting runtimes with their own caches, rollback and offline mode:
``eagle_drafter.EagleDrafter``, ``moa_drafter.MoADrafter``; ``loading.open_drafter`` builds one
from a checkpoint and the target. Pure mask functions: ``masks``. The target's frozen pieces
(embedding, norm, LM head, TLI layers): ``target_parts``.
"""
