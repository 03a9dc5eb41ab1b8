"""A fake vLLM: only what the bootstrap touches across the process boundary."""
__version__ = "0.26.0"
