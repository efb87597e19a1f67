"""Loading: hub and folder models, the embedded target's preparation, presets, which form of the embedded target a CPU runs, and building the lean target from a GGUF or a float model."""
