"""slokit: observability and SLO toolkit for LLM inference serving."""

__version__ = "0.1.0"
