"""This machine's measured prices and the calibrated acceptance estimates that choose each round's draft length (costs.py) or tree size (tree_budget.py)."""
