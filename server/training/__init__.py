"""Drafter training: runs where the target runs."""
