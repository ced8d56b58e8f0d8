"""Learned drafter models (EAGLE-2 head, Mixture of Attentions, Beagle, CORAL's LM-head router), built from
``blocks``, with their masks as pure functions, the target's frozen pieces they run on (``target_parts``)
and their checkpoints (``checkpoint``; the shipped ones in ``checkpoints/<name>/``). The drafting runtimes
run only on the client: ``edgespec.client.drafters.runtime`` and its subclasses.
"""
