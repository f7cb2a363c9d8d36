"""Factorized Active Querying (Wu et al. 2026): the method, its factor model, vectorised runs."""
