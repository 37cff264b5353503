"""The README's own commands, read from README.md, so the acceptance tests run what a new user reads.

When the README changes, these change with it: a command that stops working
as written fails its test.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

README = Path(__file__).resolve().parents[2] / "README.md"
QUICKSTART = README.parent / "quickstart"


def section(title: str) -> str:
    """The text of the ``## title`` section, up to the next ``## ``."""
    text = README.read_text(encoding="utf-8")
    match = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## |\Z)", text, re.MULTILINE | re.DOTALL)
    assert match, f"README.md has no section '## {title}'"
    return match.group(1)


def code_blocks(title: str) -> list[str]:
    """The fenced code blocks of a section."""
    return re.findall(r"^```[^\n]*\n(.*?)^```", section(title), re.MULTILINE | re.DOTALL)


def shell_commands(block: str) -> list[list[str]]:
    """The commands of a code block as argument lists: continuation lines
    joined, comments dropped, ``a && b`` as two commands."""
    commands = []
    for line in block.replace("\\\n", " ").splitlines():
        words = shlex.split(line, comments=True)
        while words:
            end = words.index("&&") if "&&" in words else len(words)
            commands.append(words[:end])
            words = words[end + 1:]
    return commands


def command_table() -> list[str]:
    """Every command synopsis of the README's command table (the backticked
    parts of its first column), e.g. ``p2ptrain pause [--for 2h]``, ``resume``."""
    synopses = []
    for line in section("What you get").splitlines():
        cells = re.split(r"(?<!\\)\|", line)
        if len(cells) < 3 or not cells[1].strip().startswith("`"):
            continue
        synopses += [text.replace("\\|", "|") for text in re.findall(r"`([^`]+)`", cells[1])]
    return synopses


def option_value(command: list[str], option: str) -> str:
    """The value after ``option`` in a command."""
    assert option in command, f"{option} is not in {shlex.join(command)}"
    return command[command.index(option) + 1]


def quickstart_demo_command() -> list[str]:
    """What ``./quickstart demo ARGS`` runs after installing: its ``demo)`` line, without ``"$@"``."""
    match = re.search(r'^\s*demo\)\s*exec\s+(.+?)\s+"\$@"', QUICKSTART.read_text(), re.MULTILINE)
    assert match, "quickstart has no `demo) exec ...` line"
    return shlex.split(match.group(1))
