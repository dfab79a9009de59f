"""Evaluators: what a run measures on held-out data."""
