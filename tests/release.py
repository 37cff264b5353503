"""p2ptrain as a release: the sdist and wheel ``python -m build`` makes, installed outside the source tree.

Installing every dependency (torch, hivemind, transformers ...) into a fresh
environment costs minutes and gigabytes, and proves nothing about p2ptrain's
own package. So the wheel is installed with ``--no-deps`` into a new venv that
sees this environment's site-packages through a ``.pth`` line: a plain path,
appended after the venv's own site-packages. The installed p2ptrain comes
first, and the editable install of the test environment is not activated (the
``.pth`` files of an appended path are not run), so ``p2ptrain.__file__`` of the
new venv lies in its own site-packages; :func:`installed_module_file` checks it.
"""

from __future__ import annotations

import shutil
import site
import subprocess
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path

from daemons import child_environment

SOURCE = Path(__file__).resolve().parents[1]
# What `python -m build` needs of the repository; p2ptrain/packaging is a symlink to packaging/.
BUILD_INPUTS = ("pyproject.toml", "README.md", "LICENSE", "p2ptrain", "packaging")


@dataclass
class Release:
    """The files ``python -m build`` made."""

    sdist: Path
    wheel: Path


@dataclass
class InstalledRelease:
    """A venv holding the installed wheel (and only it; its dependencies are this environment's)."""

    venv: Path

    @property
    def bindir(self) -> Path:
        return self.venv / "bin"

    def script(self, name: str) -> str:
        return str(self.bindir / name)

    @property
    def python(self) -> str:
        return str(self.bindir / "python")

    @property
    def site_packages(self) -> Path:
        return Path(sysconfig.get_path("purelib", vars={"base": str(self.venv), "platbase": str(self.venv)}))

    def environment(self, extra: dict | None = None) -> dict:
        """A child's environment that runs this installation: no PYTHONPATH into the source tree."""
        environment = child_environment(extra)
        environment.pop("PYTHONPATH", None)
        environment["PATH"] = f"{self.bindir}:{environment.get('PATH', '')}"
        return environment

    def run(self, *argv: str, cwd: Path, timeout: float = 120, extra_env: dict | None = None) -> subprocess.CompletedProcess:
        return subprocess.run(list(argv), cwd=cwd, capture_output=True, text=True, timeout=timeout, env=self.environment(extra_env))

    def installed_module_file(self, cwd: Path) -> Path:
        """Where the venv's python imports p2ptrain from (run in ``cwd``, outside the source tree)."""
        result = self.run(self.python, "-c", "import p2ptrain; print(p2ptrain.__file__)", cwd=cwd)
        assert result.returncode == 0, result.stderr
        return Path(result.stdout.strip())


def build_release(work_dir: Path) -> Release:
    """Copy what the build needs into ``work_dir/src`` and run ``python -m build`` there.

    Without ``--sdist`` or ``--wheel``, build makes the sdist and then the wheel
    *from the sdist*, so a file the sdist lacks is missing from the wheel too.
    ``--no-isolation`` builds with this environment's setuptools (no download).
    A copy keeps the build's ``*.egg-info`` and ``build/`` out of the checkout.
    """
    source = work_dir / "src"
    source.mkdir(parents=True)
    for name in BUILD_INPUTS:
        origin = SOURCE / name
        if origin.is_dir():
            shutil.copytree(origin, source / name, symlinks=True, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            shutil.copy2(origin, source / name)
    dist = work_dir / "dist"
    result = subprocess.run(
        [sys.executable, "-m", "build", "--no-isolation", "--outdir", str(dist), str(source)],
        capture_output=True, text=True, timeout=300, cwd=work_dir,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    (sdist,) = dist.glob("p2ptrain-*.tar.gz")
    (wheel,) = dist.glob("p2ptrain-*.whl")
    return Release(sdist=sdist, wheel=wheel)


def install_wheel(wheel: Path, venv: Path, python: str | None = None) -> InstalledRelease:
    """A new venv at ``venv`` with ``wheel`` installed (no dependencies) and this environment's packages behind it.

    Args:
        wheel: the built wheel.
        venv: where to create the venv (outside the source tree).
        python: the interpreter to base the venv on (default: the one under this environment).
    """
    base = python or getattr(sys, "_base_executable", sys.executable)
    subprocess.run([base, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120, capture_output=True)
    installed = InstalledRelease(venv)
    dependencies = [path for path in site.getsitepackages() if Path(path).is_dir()]
    (installed.site_packages / "_p2ptrain_dependencies.pth").write_text("\n".join(dependencies) + "\n")
    # --ignore-installed: the p2ptrain of the dependencies' environment (an editable install) must not
    # count as already there, nor be uninstalled
    result = subprocess.run(
        [sys.executable, "-m", "pip", "--python", installed.python, "install", "--no-deps", "--no-index",
         "--ignore-installed", "--disable-pip-version-check", "--quiet", str(wheel)],
        capture_output=True, text=True, timeout=300, env=installed.environment(),
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return installed
