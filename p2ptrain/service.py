"""``p2ptrain service install | uninstall``: put the systemd unit (and its users and directories) in place, or take it away.

Two flavours:

- the system service (``sudo p2ptrain service install``): runs as the
  ``p2ptrain`` user at idle priority from boot on; writes
  ``/etc/systemd/system/p2ptrain.service``, ``/etc/sysusers.d/p2ptrain.conf``
  and ``/etc/tmpfiles.d/p2ptrain.conf``;
- a user service (``p2ptrain service install --user``): runs as you, no root
  needed; writes ``~/.config/systemd/user/p2ptrain.service``.

The unit templates ship in ``packaging/`` of the source tree and, through the
``p2ptrain/packaging`` symlink, as package data of the wheel. ``@BINDIR@``
in them becomes the directory of the ``p2ptrain`` script being run, so the
unit starts the same installation that installed it.

Files are written, and the ``systemctl`` commands that enable the service are
returned for the caller to show (or run): enabling a service that trains
around the clock is a step the volunteer takes knowingly.

``uninstall`` removes those files and the ``enable`` symlinks (what
``systemctl disable`` removes) and returns the commands that stop the running
service; the state (database, identity, checkpoints) is kept.

Standard library only: the CLI imports this module lazily.
"""

from __future__ import annotations

import importlib.resources
import os
import re
import shlex
import shutil
import sys
import tempfile
from pathlib import Path

UNIT_NAME = "p2ptrain.service"
SCRIPT_NAME = "p2ptrain"
# Where the system service's files go, relative to the root. /etc, not
# /usr/lib: these are the administrator's files, not a distribution package's.
SYSTEM_UNIT = Path("etc/systemd/system") / UNIT_NAME
SYSUSERS_FILE = Path("etc/sysusers.d/p2ptrain.conf")
TMPFILES_FILE = Path("etc/tmpfiles.d/p2ptrain.conf")

# ExecStart= splits on whitespace and expands quotes, backslashes, $ and %;
# a directory made of these characters needs none of that.
_PLAIN_PATH = re.compile(r"[A-Za-z0-9_./+,:@=~-]+")
# Hidden from the system service by ProtectHome=yes.
_HOME_PREFIXES = ("/home/", "/root/", "/run/user/")


class ServiceInstallError(Exception):
    """The service cannot be installed; the message is one line that says how to fix it."""


def install_service(user: bool, bindir: str | None = None, dry_run: bool = False, root: str = "/") -> list[str]:
    """Write the unit files and return the commands that enable the service.

    Args:
        user: install a user service (``systemctl --user``) instead of the
            system service.
        bindir: the directory holding the ``p2ptrain`` script that the unit
            runs; default: the one being run now (see :func:`find_bindir`).
        dry_run: check everything and return the commands, but write nothing;
            :func:`planned_files` shows what would be written.
        root: install into this directory instead of ``/`` (an image being
            built, or a test). The system-service commands then carry
            ``--root`` too; user-service commands are the ones to run in the
            finished system.

    Returns:
        Shell commands, in order, that activate the installed files.

    Raises:
        ServiceInstallError: not root for a system install into ``/``, sudo
            for a user install, no usable ``p2ptrain`` script, or a file that
            cannot be written.
    """
    installing_live = os.path.abspath(root) == "/"
    if installing_live and not dry_run:
        if not user and os.geteuid() != 0:
            raise ServiceInstallError(
                "installing the system service needs root: run `sudo p2ptrain service install`, "
                "or `p2ptrain service install --user` for a service of your own"
            )
        if user and os.geteuid() == 0 and os.environ.get("SUDO_USER"):
            raise ServiceInstallError(
                "`--user` under sudo would install into root's home: run `p2ptrain service install --user` without sudo"
            )
    files = planned_files(user=user, bindir=bindir, root=root)
    if not dry_run:
        for destination, text in files.items():
            _write_file(destination, text)
    return _next_commands(user=user, root=root)


def uninstall_service(user: bool, dry_run: bool = False, root: str = "/") -> tuple[list[Path], list[str]]:
    """Remove what :func:`install_service` wrote, and the symlinks that enable it.

    Args:
        user: the user service instead of the system service.
        dry_run: remove nothing; return what would be removed.
        root: the directory the service was installed into (``/`` for the running system).

    Returns:
        (the files and symlinks removed, or that would be removed; the shell
        commands that stop the running service and make systemd forget it).

    Raises:
        ServiceInstallError: not root for the system service in ``/``, nothing
            installed, or a file that cannot be removed.
    """
    if os.path.abspath(root) == "/" and not dry_run and not user and os.geteuid() != 0:
        raise ServiceInstallError("removing the system service needs root: run `sudo p2ptrain service uninstall`")
    base = Path(root)
    if user:
        unit_dir = base / _relative(_user_unit_dir())
        files = [unit_dir / UNIT_NAME]
    else:
        unit_dir = base / SYSTEM_UNIT.parent
        files = [base / SYSTEM_UNIT, base / SYSUSERS_FILE, base / TMPFILES_FILE]
    # `systemctl enable` links the unit from <target>.wants/ directories beside it
    enabled = [link for link in unit_dir.glob(f"*.wants/{UNIT_NAME}") if link.is_symlink()]
    present = [path for path in files if path.exists()] + enabled
    if not present:
        flag = " --user" if user else ""
        raise ServiceInstallError(f"no p2ptrain{flag} service is installed here (nothing at {files[0]}); nothing to remove")
    if not dry_run:
        for path in present:
            try:
                path.unlink()
            except OSError as error:
                raise ServiceInstallError(f"cannot remove {path}: {error.strerror}; check the permissions of {path.parent}") from error
    systemctl = "systemctl --user" if user else "systemctl"
    if os.path.abspath(root) != "/":
        return present, [f"systemctl --root={shlex.quote(str(base.absolute()))} daemon-reload  # when that system runs"]
    return present, [f"{systemctl} stop {UNIT_NAME}", f"{systemctl} daemon-reload"]


def planned_files(user: bool, bindir: str | None = None, root: str = "/") -> dict[Path, str]:
    """The files :func:`install_service` writes: destination path -> content.

    Args:
        user: the user service instead of the system service.
        bindir: the directory of the ``p2ptrain`` script (default: :func:`find_bindir`).
        root: prefix for every destination (``/`` for the running system).
    """
    bindir = _checked_bindir(bindir or find_bindir(), system=not user)
    base = Path(root)
    if user:
        unit = _read_packaged("p2ptrain-user.service")
        return {base / _relative(_user_unit_dir()) / UNIT_NAME: render_unit(unit, bindir)}
    return {
        base / SYSTEM_UNIT: render_unit(_read_packaged("p2ptrain.service"), bindir),
        base / SYSUSERS_FILE: _read_packaged("sysusers.d/p2ptrain.conf"),
        base / TMPFILES_FILE: _read_packaged("tmpfiles.d/p2ptrain.conf"),
    }


def render_unit(template: str, bindir: str) -> str:
    """Replace ``@BINDIR@`` in a unit template with ``bindir``.

    Args:
        template: the text of ``packaging/p2ptrain.service`` or ``p2ptrain-user.service``.
        bindir: an absolute directory whose name needs no systemd quoting.
    """
    if "@BINDIR@" not in template:
        raise ServiceInstallError("the unit template has no @BINDIR@: reinstall p2ptrain, the package is damaged")
    return template.replace("@BINDIR@", bindir.rstrip("/") or "/")


def find_bindir() -> str:
    """The directory of the ``p2ptrain`` script that is running now.

    In order: the directory of ``sys.argv[0]`` when that is the script; the
    directory of the running interpreter when it holds the script (a venv run
    as ``python -m p2ptrain``); the first ``p2ptrain`` on ``PATH``.
    """
    script = Path(sys.argv[0]) if sys.argv and sys.argv[0] else None
    if script is not None and script.name == SCRIPT_NAME and _is_executable(script):
        return str(script.absolute().parent)
    interpreter_dir = Path(sys.executable).parent
    if _is_executable(interpreter_dir / SCRIPT_NAME):
        return str(interpreter_dir.absolute())
    on_path = shutil.which(SCRIPT_NAME)
    if on_path:
        return str(Path(on_path).absolute().parent)
    raise ServiceInstallError(
        "cannot find the p2ptrain script: pass --bindir with the directory that holds it (e.g. /opt/p2ptrain/bin)"
    )


def packaged_file(relative: str) -> Path:
    """The path of a file under ``packaging/``, e.g. ``sysusers.d/p2ptrain.conf``."""
    packaged = importlib.resources.files("p2ptrain").joinpath("packaging", relative)
    if packaged.is_file():
        return Path(str(packaged))
    # A source checkout whose p2ptrain/packaging symlink did not survive
    # (a copy that drops symlinks): the canonical files sit next to the package.
    checkout = Path(__file__).resolve().parent.parent / "packaging" / relative
    if checkout.is_file():
        return checkout
    raise ServiceInstallError(f"packaging/{relative} is missing: reinstall p2ptrain, the package is damaged")


def _read_packaged(relative: str) -> str:
    return packaged_file(relative).read_text(encoding="utf-8")


def _checked_bindir(bindir: str, system: bool) -> str:
    path = Path(bindir).expanduser()
    if not path.is_absolute():
        raise ServiceInstallError(f"--bindir {bindir} is relative: pass an absolute directory")
    path = Path(os.path.normpath(path))
    script = path / SCRIPT_NAME
    if not _is_executable(script):
        raise ServiceInstallError(f"no executable p2ptrain in {path}: pass --bindir with the directory that holds it")
    if not _PLAIN_PATH.fullmatch(str(path)):
        raise ServiceInstallError(
            f"systemd cannot run p2ptrain from {path}: install it in a directory without spaces, quotes, $ or %"
        )
    if system:
        for needed in (script.resolve(), _interpreter_of(script)):
            if needed is not None and str(needed).startswith(_HOME_PREFIXES):
                raise ServiceInstallError(
                    f"the system service cannot see {needed} (home directories are hidden from it): "
                    "install p2ptrain outside /home, e.g. in a venv under /opt/p2ptrain, or use --user"
                )
    return str(path)


def _interpreter_of(script: Path) -> Path | None:
    """The interpreter of a ``#!`` script (pip's console scripts), or None for a binary."""
    try:
        with open(script, "rb") as handle:
            first_line = handle.readline(4096)
    except OSError:
        return None
    if not first_line.startswith(b"#!"):
        return None
    words = first_line[2:].decode("utf-8", "replace").split()
    return Path(words[0]).resolve() if words else None


def _is_executable(path: Path) -> bool:
    return path.is_file() and os.access(path, os.X_OK)


def _user_unit_dir() -> Path:
    config_home = os.environ.get("XDG_CONFIG_HOME")
    base = Path(config_home) if config_home and os.path.isabs(config_home) else Path.home() / ".config"
    return base / "systemd" / "user"


def _relative(path: Path) -> Path:
    return path.relative_to(path.anchor)


def _write_file(destination: Path, text: str) -> None:
    """Write atomically with mode 0644 (units and configs are world-readable by convention)."""
    try:
        destination.parent.mkdir(parents=True, exist_ok=True)
        handle, temporary = tempfile.mkstemp(dir=destination.parent, prefix=f".{destination.name}.")
        try:
            with os.fdopen(handle, "w", encoding="utf-8") as file:
                file.write(text)
            os.chmod(temporary, 0o644)
            os.replace(temporary, destination)
        except BaseException:
            os.unlink(temporary)
            raise
    except OSError as error:
        raise ServiceInstallError(
            f"cannot write {destination}: {error.strerror}; check the permissions of {destination.parent}"
        ) from error


def _next_commands(user: bool, root: str) -> list[str]:
    if user:
        commands = ["systemctl --user daemon-reload", f"systemctl --user enable --now {UNIT_NAME}"]
        login = os.environ.get("USER") or os.environ.get("LOGNAME")
        if login:
            commands.append(f"loginctl enable-linger {shlex.quote(login)}  # keep training while you are logged out")
        return commands
    if os.path.abspath(root) != "/":
        # Offline install into an image: the tools take --root and read every
        # config below it; nothing can be started there.
        quoted_root = shlex.quote(str(Path(root).absolute()))
        return [
            f"systemd-sysusers --root={quoted_root}",
            f"systemd-tmpfiles --root={quoted_root} --create",
            f"systemctl --root={quoted_root} enable {UNIT_NAME}",
        ]
    commands = [
        f"systemd-sysusers /{SYSUSERS_FILE}",
        f"systemd-tmpfiles --create /{TMPFILES_FILE}",
        "systemctl daemon-reload",
        f"systemctl enable --now {UNIT_NAME}",
    ]
    invoking_user = os.environ.get("SUDO_USER")
    if invoking_user and invoking_user != "root":
        commands.append(
            f"usermod -aG p2ptrain {shlex.quote(invoking_user)}  # lets you run `p2ptrain status`; log in again after"
        )
    return commands
