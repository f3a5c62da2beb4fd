"""One benchmark process: run a command with the repo importable, return the JSON it printed last."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess

ROOT = pathlib.Path(__file__).resolve().parent.parent


def run_json(command: list[str]) -> dict:
    """The JSON object at the end of the command's stdout: one line, or indented over several
    (its first line is the last one that starts with "{")."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    lines = subprocess.run(command, capture_output=True, text=True, env=env, check=True).stdout.splitlines()
    start = max(i for i, line in enumerate(lines) if line.startswith("{"))
    return json.loads("\n".join(lines[start:]))
