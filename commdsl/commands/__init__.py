"""Subcommands of the `commdsl` console script, one module each."""
