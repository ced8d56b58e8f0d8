"""The wire contract: ``edgespec/v1/*.proto`` and the stubs generated from it."""
