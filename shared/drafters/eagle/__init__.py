"""EAGLE-2: a one-block head that predicts the target's next LM-head input from [token ; feature]
(``model``); its drafting runtime is ``edgespec.client.drafters.learned.eagle_runtime``, its training recipe
``edgespec.server.training.eagle_recipe``. Imports nothing, so opening one module of the family loads no other."""
