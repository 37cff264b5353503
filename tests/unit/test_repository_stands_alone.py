"""A clone of p2ptrain holds everything it refers to: no file names a path outside the repository.

The design and the findings behind it live in ``docs/``. A pointer to a file in
a folder beside the repository, or to an absolute path on one
developer's machine (a workspace or a home directory), reads fine on that
machine and is a dead end everywhere else. Paths of the product itself
(``/etc/p2ptrain``, ``/run/p2ptrain``, ``/var/lib/p2ptrain``, ``/tmp/...``) and
of standard places (``/dev/shm``, ``/proc``) are what the code really uses, so
they are allowed.

Checked: every file git tracks, plus new files not ignored yet (so a pointer
is caught before it is committed); relative links in Markdown files must lead
to a file or folder inside the repository; symbolic links must stay inside it.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

REPOSITORY = Path(__file__).resolve().parents[2]

# Each pattern is written so that it does not match its own source line.
OUTSIDE_POINTERS = {
    "a folder beside the repository": re.compile(r"\.\./shared\b"),
    "a workspace of one machine": re.compile(r"(?<![\w.~-])/wor[k]/"),
    "a home directory of one machine": re.compile(r"(?<![\w.~-])(?:/hom[e]/|/User[s]/)(?!volunteer\b)[A-Za-z_][\w.-]*"),
    "root's home directory": re.compile(r"(?<![\w.~-])/roo[t]/[\w.-]"),
}
# /home/volunteer: the made-up home of tests/unit/test_service_units.py (a unit refuses scripts under /home).

MARKDOWN_LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")


def repository_files(root: Path = REPOSITORY) -> list[Path]:
    """Every tracked file and every untracked one that is not ignored, as paths under ``root``."""
    if shutil.which("git") is None or not (root / ".git").exists():
        pytest.skip("not a git checkout: the files of the repository cannot be listed")
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=root, capture_output=True, check=True,
    ).stdout.decode()
    return [root / name for name in sorted(set(listed.split("\0"))) if name and ((root / name).is_symlink() or (root / name).is_file())]


def text_of(path: Path) -> str | None:
    """The file's text, or None for a binary file (a PNG) or a symbolic link."""
    if path.is_symlink():
        return None
    data = path.read_bytes()
    if b"\0" in data:
        return None
    return data.decode("utf-8", errors="replace")


def outside_pointers(text: str) -> list[tuple[int, str, str]]:
    """(line number, what it points to, the match) for each pointer outside the repository in ``text``."""
    found = []
    for number, line in enumerate(text.splitlines(), start=1):
        for what, pattern in OUTSIDE_POINTERS.items():
            found.extend((number, what, match.group(0)) for match in pattern.finditer(line))
    return found


def broken_links(path: Path, text: str, root: Path = REPOSITORY) -> list[str]:
    """Relative links of a Markdown file that leave the repository or lead nowhere."""
    broken = []
    for target in MARKDOWN_LINK.findall(text):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.IGNORECASE) or target.startswith("#"):
            continue  # https:, mailto:, an anchor in the same file
        relative = target.split("#", 1)[0]
        if not relative:
            continue
        resolved = (root if relative.startswith("/") else path.parent).joinpath(relative.lstrip("/")).resolve()
        if not resolved.is_relative_to(root):
            broken.append(f"{target} (outside the repository)")
        elif not resolved.exists():
            broken.append(f"{target} (no such file)")
    return broken


def test_no_file_points_outside_the_repository():
    problems = []
    for path in repository_files():
        text = text_of(path)
        if text is None:
            continue
        for number, what, match in outside_pointers(text):
            problems.append(f"{path.relative_to(REPOSITORY)}:{number}: {match!r} names {what}")
    assert not problems, (
        "files name paths that a clone of the repository does not have; point into docs/ instead "
        "(docs/design.md, docs/findings/):\n" + "\n".join(problems)
    )


def test_markdown_links_stay_inside_the_repository():
    problems = []
    for path in repository_files():
        if path.suffix != ".md" or (text := text_of(path)) is None:
            continue
        problems.extend(f"{path.relative_to(REPOSITORY)}: {link}" for link in broken_links(path, text))
    assert not problems, "Markdown links that a clone cannot follow:\n" + "\n".join(problems)


def test_symbolic_links_stay_inside_the_repository():
    escaping = [
        f"{path.relative_to(REPOSITORY)} -> {path.readlink()}"
        for path in repository_files()
        if path.is_symlink() and not path.resolve().is_relative_to(REPOSITORY)
    ]
    assert not escaping, "symbolic links out of the repository:\n" + "\n".join(escaping)


def test_the_check_finds_what_it_is_for():
    """The patterns catch the pointers this test exists for, and leave the product's own paths alone."""
    shared = "../" + "shared/DESIGN.md"
    caught = [
        f"Read `{shared}`",
        "see " + "/wor" + "k/shared/NETWORK-FINDINGS.md",
        "python at " + "/hom" + "e/alice/venv/bin/python",
        "/roo" + "t/.cache/huggingface",
        "/User" + "s/bob/p2ptrain",
    ]
    allowed = [
        "/etc/p2ptrain/config.toml",
        "/run/p2ptrain/control.sock",
        "/var/lib/p2ptrain",
        "/tmp/p2ptrain-tmp-0123456789abcdef",
        "benchmarks/request_counts.py /tmp/requests",
        '_HOME_PREFIXES = ("/hom' + 'e/", "/roo' + 't/", "/run/user/")',
        "install p2ptrain outside /home and /root",
        "HOME=/hom" + "e/volunteer",
        "/hom" + "e/$USER/.config, /hom" + "e/<user>",
        "peers/net/network.py",
        "~/.config/p2ptrain/config.toml",
    ]
    assert [line for line in caught if not outside_pointers(line)] == []
    assert [line for line in allowed if outside_pointers(line)] == []


def test_broken_links_are_found(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "design.md").write_text("x")
    page = tmp_path / "docs" / "findings.md"
    text = "[design](design.md) [up](../README.md) [out](../../elsewhere/DESIGN.md) [web](https://example.org) [here](#top)"
    assert broken_links(page, text, root=tmp_path) == ["../README.md (no such file)", "../../elsewhere/DESIGN.md (outside the repository)"]
