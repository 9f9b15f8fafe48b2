"""ml_collections configs: `default.py` (offline, CPU) and one file per recipe."""
