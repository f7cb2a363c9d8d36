"""Replaying recorded scores as if the models were queried live, as a library."""
