"""Drafter training: runs where the target runs, one resumable command per stage (``cli``: `edgespec train
data | features | fit | ship`; run one again to continue it).

Modules by stage: data (``prompts``: stdlib prompts, ``corpus``: local files, ``data``: the target's own
responses; test sets never enter) -> features (``features``, ``extraction``: int8 stores; ``online``: from the
target during fit) -> fit (``recipes`` by name over the ``recipe`` protocol and ``losses``, ``trainer``, ``fit``,
``distributed``) -> ``ship``.
"""
