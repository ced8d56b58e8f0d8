"""Learned drafter models (EAGLE-2 head, Mixture of Attentions, Beagle), their masks and checkpoints.

Models: ``eagle`` (EagleHead), ``moa`` (MoAClient + the server's ``lsa.LayerSelfAttention``),
``beagle`` (BeagleHead), ``router`` (CORAL's LM-head router), built from ``blocks``. Pure mask
functions: ``masks``, ``beagle_masks``. The target's frozen pieces (embedding, norm, LM head,
TLI layers): ``target_parts``. Checkpoints: ``checkpoint`` (finding one by name or path, its safetensors
files, MoA's server part; the shipped ones in ``checkpoints/<name>/``), ``vocab`` (reduced draft
vocabulary). The drafting runtimes run only on the client:
``edgespec.client.drafters.runtime`` and its subclasses.
"""
