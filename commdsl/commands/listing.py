"""`commdsl list`: the bundled schedules and the first line of their docs."""

from __future__ import annotations

import argparse

import yaml

from commdsl.resources import bundled_schedules, schedules_dir


def add_arguments(parser: argparse.ArgumentParser) -> None:
    pass


def run(args: argparse.Namespace) -> int:
    for name in bundled_schedules():
        data = yaml.safe_load((schedules_dir() / f"{name}.yaml").read_text()) or {}
        doc = str(data.get("doc", "")).strip().splitlines()
        print(f"{name:18} {doc[0] if doc else ''}")
    return 0
