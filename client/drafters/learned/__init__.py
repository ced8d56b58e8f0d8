"""The learned drafters' client side: one drafting runtime a family (``eagle_runtime``, ``moa_runtime``,
``beagle_runtime``, each over its model in ``edgespec.shared.drafters.<family>``), and beside them what all of
them share: the runtimes' base (``runtime``), the client's ``Drafter`` over any of them (``drafter``) and the
loader that picks one by its checkpoint (``loading``). A runtime imports its own family's model and the shared
modules, never another family's. Imports nothing, so opening one runtime loads only what it names."""
