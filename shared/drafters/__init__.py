"""Learned drafter models (EAGLE-2 head, Mixture of Attentions) and their parts."""
