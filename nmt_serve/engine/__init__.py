"""The engine process: owns the models, the continuous batching and all torch work (see core.py)."""
