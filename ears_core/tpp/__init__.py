"""Speculative sampling for temporal point processes (seed 001, second half)."""
