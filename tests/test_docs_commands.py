"""The commands users run: a script's `--help` opens with what it does, and every `--help` lists
each flag the docs pass it.

A flag renamed in code but not in README.md, BUILD.md or docs/ would fail only when a reader
types it; a description cut at the docstring's first line break reads as a fragment. Each
command's `--help` is produced in this process, as `python ...` would run it (runpy,
`__name__ == "__main__"`); `TXJAX_MALLOC=default` from conftest keeps malloc alone.
"""

import ast
import re
import runpy
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = sorted({ROOT / "README.md", ROOT / "BUILD.md", *(ROOT / "docs").rglob("*.md")})
# `python experiments/x.py ...`, `python -m txjax.y ...`; a command ends at a line end (unless
# continued by a backslash), a backquote or a table's `|`.
COMMAND = re.compile(r"python3? (?:-m (txjax[\w.]*)|((?:experiments|benchmarks)/\w+\.py))((?:\\\n|[^\n`|])*)")
FLAG = re.compile(r"(?<![\w-])--[a-zA-Z][\w-]*")


def documented_flags() -> dict[str, dict[str, list[str]]]:
    """{command: {flag: ["README.md:12", ...]}} over every command the docs show."""
    found: dict[str, dict[str, list[str]]] = {}
    for doc in DOCS:
        text = doc.read_text()
        for m in COMMAND.finditer(text):
            where = f"{doc.relative_to(ROOT)}:{text.count(chr(10), 0, m.start()) + 1}"
            flags = found.setdefault(m.group(1) or m.group(2), {})
            for flag in FLAG.findall(m.group(3).replace("\\\n", " ")):
                flags.setdefault(flag, []).append(where)
    return found


FLAGS = documented_flags()
# Every script a user runs, documented or not (a leading underscore marks a helper module).
COMMANDS = sorted({*FLAGS, *(str(p.relative_to(ROOT)) for folder in ("experiments", "benchmarks")
                             for p in (ROOT / folder).glob("[!_]*.py"))})


def test_the_docs_show_the_main_commands():
    assert {"experiments/train_gpt.py", "txjax.bench", "benchmarks/cpu_vs_torch.py"} <= set(FLAGS)
    assert "--preset" in FLAGS["experiments/train_gpt.py"]


@pytest.mark.filterwarnings("ignore:.*found in sys.modules:RuntimeWarning")  # txjax imports it first
@pytest.mark.parametrize("command", COMMANDS)
def test_help_says_what_the_command_does_and_lists_every_documented_flag(command, monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", [command, "--help"])
    with pytest.raises(SystemExit) as exit_info:
        if command.endswith(".py"):
            monkeypatch.syspath_prepend(str(ROOT / Path(command).parent))  # as `python path` puts its folder first
            runpy.run_path(str(ROOT / command), run_name="__main__")
        else:
            runpy.run_module(command, run_name="__main__", alter_sys=True)
    assert exit_info.value.code in (0, None)
    help_text = capsys.readouterr().out
    if command.endswith(".py"):  # a script describes itself by its docstring's first paragraph
        summary = ast.get_docstring(ast.parse((ROOT / command).read_text())).split("\n\n")[0]
        assert " ".join(summary.split()) in " ".join(help_text.split()), f"{command}: --help cuts its summary"
    unknown = {flag: where for flag, where in FLAGS.get(command, {}).items()
               if not re.search(re.escape(flag) + r"(?![\w-])", help_text)}
    assert not unknown, f"{command}: flags the docs pass but --help does not list: {unknown}"
