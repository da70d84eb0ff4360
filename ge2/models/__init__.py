"""Complete models built from ``ge2.nn``: ``GPT`` (nanoGPT's architecture)."""
from ge2.models.gpt import GPT  # noqa: F401
