"""Training engine: pure loss math behind registries, the per-agent trainer, slots, weights.

`catalog` answers the driver's questions about the loss registries without importing torch.
"""
