"""The generation loop: one generation's numbered steps (``generation.py``), the pipeline that drafts the next
tree while a verification is out (``pipeline.py``) and its guesses (``guess.py``), the planner that sizes each
step's tree (``planner.py``, on the pure cost model of ``tree_size.py``), and the rules that commit a verdict
(``commit.py``). It talks to the server only through ``edgespec.client.link.verifier``'s domain types."""
