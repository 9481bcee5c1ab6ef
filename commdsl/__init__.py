"""commdsl: a schedule language, simulator and executor for distributed-training communication."""

__version__ = "0.1.0"
