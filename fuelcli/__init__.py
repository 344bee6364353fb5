"""fuel: run, inspect, check and measure decoder LLMs on the CPU."""

__version__ = "0.2.0"
