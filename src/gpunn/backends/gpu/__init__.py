"""The GPU training engine: one engine (engine.py) for every model of gpunn.nn, per-layer launchers
(layers.py) and the policies that make the GPU variants (policy.py)."""
