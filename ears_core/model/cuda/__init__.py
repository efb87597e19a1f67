"""CUDA capture: graph banks over a model's one KV store, and the graphed causal LM and draft head that replay them (a wrapper, used on CUDA only)."""
