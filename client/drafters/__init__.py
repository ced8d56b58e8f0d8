"""Drafters the client runs."""
