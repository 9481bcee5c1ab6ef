"""Front end: YAML schedule + Lark op language -> `commdsl.ir.Program`."""

from commdsl.dsl.loader import DEFAULT_MAX_OPS, load_schedule, load_schedule_text, parse_overrides

__all__ = ["DEFAULT_MAX_OPS", "load_schedule", "load_schedule_text", "parse_overrides"]
