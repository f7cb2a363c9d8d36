"""certeval: adaptive, certified LLM evaluation."""

__version__ = "0.1.0"
