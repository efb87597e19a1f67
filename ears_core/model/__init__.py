"""Models below the decoder: the embedded target's preparation, hub and folder loading, CPU kernels (packed linear layers, the output head), KV-cache edits, pass timing and thread hand-off."""
