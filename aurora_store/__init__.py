"""Aurora's library: delta codec, bucket store, Redis control plane and scheduling (no RL code)."""

__version__ = "0.1.0"
