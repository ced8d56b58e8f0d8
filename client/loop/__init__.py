"""The generation loop: one generation's numbered steps (``generation.py``), the pipeline that drafts the next
tree while a verification is out (``pipeline.py``), the planner that sizes each step's tree (``planner.py``, on
the pure cost model of ``tree_size.py``), and a verdict's rules (``verdict.py``): guessing it before it comes,
committing it when it does. It talks to the server only through ``edgespec.client.link.verifier``'s domain types."""
