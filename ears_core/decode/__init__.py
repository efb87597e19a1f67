"""Decoding: one loop of speculative rounds (rounds.py) with two round shapes (chain.py, tree.py), the
verifiers (verify.py, verify_tree.py, tree_walk.py), the target-only baseline and the public functions (api.py)."""
