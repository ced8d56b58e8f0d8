"""Learned drafter models, one folder a family: ``eagle/`` (EAGLE-2 head), ``moa/`` (Mixture of Attentions:
client part, Layer Self-Attention, both halves), ``beagle/`` (Beagle and its training masks). Beside them, what
every family shares: ``blocks`` (attention layers and the masks they take), ``target_parts`` (the target's
frozen pieces they run on, its LM head in int8 among them), ``checkpoint`` (finding, reading and writing one;
the shipped ones in ``checkpoints/<name>/``); and what a family may use but none needs: ``router`` (CORAL's
LM-head router), ``vocab`` (reduced draft vocabularies). A family imports the shared modules and never another
family's (tests/shared/drafters/test_family_modules.py). The drafting runtimes run only on the client:
``edgespec.client.drafters.learned``.
"""
