"""CUDA capture: graph banks over a static KV buffer, and the graphed causal LM and draft head that replay them (a wrapper, used on CUDA only)."""
