"""Mixture of Attentions: the client part (``client_part``: all the client's drafting runtime needs), the
server's Layer Self-Attention (``lsa``) and both halves together (``model``: what training builds, saves and
ships). Its drafting runtime is ``edgespec.client.drafters.learned.moa_runtime``. Imports nothing, so opening
one module of the family loads no other."""
