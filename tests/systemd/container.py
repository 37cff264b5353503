"""A Debian system booted with systemd as PID 1 in a container (``systemd-nspawn``), for the systemd lab.

- The root file system is made once by ``debootstrap`` (about a minute, 300 MB)
  and kept in ``P2PTRAIN_ROOTFS_CACHE`` (default
  ``/var/cache/p2ptrain-tests/debian-bookworm``); each boot runs on a tmpfs
  overlay of it (``--volatile=overlay``), so it never changes.
- The container has its own network namespace with loopback only
  (``--private-network``) and is not registered with a host machined
  (``--register=no --keep-unit``): neither needs systemd on the host.
- Commands run inside with ``nsenter`` into the container's PID 1, with a clean
  environment, as root or (``user=``) as a user through ``runuser``.

Needs root, ``systemd-nspawn`` (package systemd-container), ``debootstrap`` and
``nsenter``; :func:`missing_tools` installs them with apt-get when it can.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import signal
import subprocess
import time
from pathlib import Path

import psutil

ROOTFS_CACHE = Path(os.environ.get("P2PTRAIN_ROOTFS_CACHE", "/var/cache/p2ptrain-tests/debian-bookworm"))
SUITE, MIRROR = "bookworm", "http://deb.debian.org/debian"
# systemd as init, a D-Bus for logind and user sessions, the Python the wheel is installed with, ps/ionice/runuser
PACKAGES = ("systemd", "systemd-sysv", "dbus", "dbus-user-session", "libpam-systemd", "python3", "python3-venv",
            "procps", "util-linux")
TOOLS = {"systemd-nspawn": "systemd-container", "debootstrap": "debootstrap", "nsenter": "util-linux"}
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def missing_tools() -> str | None:
    """Why the lab cannot run here, or None; installs the tools with apt-get when root and missing."""
    if os.geteuid() != 0:
        return "the systemd lab boots a container: it needs root"
    absent = [package for tool, package in TOOLS.items() if shutil.which(tool) is None]
    if absent and shutil.which("apt-get"):
        environment = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
        install = ["apt-get", "install", "-y", "-qq", "--no-install-recommends", *absent]
        if subprocess.run(install, capture_output=True, env=environment, timeout=900).returncode != 0:
            subprocess.run(["apt-get", "update", "-qq"], capture_output=True, env=environment, timeout=600)
            subprocess.run(install, capture_output=True, env=environment, timeout=900)
    still = [tool for tool in TOOLS if shutil.which(tool) is None]
    return f"missing {', '.join(still)}: apt-get install {' '.join(TOOLS[tool] for tool in still)}" if still else None


def cached_rootfs() -> Path:
    """The Debian root file system, debootstrapped into the cache the first time."""
    marker = ROOTFS_CACHE / ".p2ptrain-packages"
    if marker.is_file() and marker.read_text().split() == list(PACKAGES):
        return ROOTFS_CACHE
    building = ROOTFS_CACHE.with_name(f"{ROOTFS_CACHE.name}.building-{os.getpid()}")
    shutil.rmtree(building, ignore_errors=True)
    building.parent.mkdir(parents=True, exist_ok=True)
    result = subprocess.run(
        ["debootstrap", "--variant=minbase", f"--include={','.join(PACKAGES)}", SUITE, str(building), MIRROR],
        capture_output=True, text=True, timeout=1800,
    )
    if result.returncode != 0:
        shutil.rmtree(building, ignore_errors=True)
        raise RuntimeError(f"debootstrap failed: {result.stdout[-2000:]}{result.stderr[-2000:]}")
    (building / ".p2ptrain-packages").write_text("\n".join(PACKAGES) + "\n")
    shutil.rmtree(ROOTFS_CACHE, ignore_errors=True)
    building.rename(ROOTFS_CACHE)
    return ROOTFS_CACHE


class Container:
    """One boot of ``rootfs`` under systemd-nspawn.

    Args:
        rootfs: the root file system (left unchanged: writes go to a tmpfs overlay).
        read_only_binds: host path -> path in the container, mounted read-only.
        log_path: where the container's console goes.
    """

    def __init__(self, rootfs: Path, read_only_binds: dict[str, str], log_path: Path):
        self.rootfs = rootfs
        self.read_only_binds = read_only_binds
        self.log_path = log_path
        self.name = f"p2ptrain-lab-{os.getpid()}"
        self.process: subprocess.Popen | None = None
        self.leader: int | None = None

    def boot(self, timeout: float = 180) -> None:
        """Start the container and wait until its systemd says the system is up."""
        binds = [f"--bind-ro={host}:{inside}" for host, inside in self.read_only_binds.items()]
        with open(self.log_path, "w") as log:
            self.process = subprocess.Popen(
                ["systemd-nspawn", "--quiet", "--keep-unit", "--register=no", f"--directory={self.rootfs}",
                 "--volatile=overlay", "--private-network", f"--machine={self.name}", *binds, "--boot"],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"systemd-nspawn exited with {self.process.returncode}: {self.console()[-3000:]}")
            self.leader = self._find_leader()
            if self.leader:
                state = self.run("systemctl is-system-running", check=False).stdout.strip()
                if state in ("running", "degraded"):
                    return
            time.sleep(0.5)
        raise RuntimeError(f"the container did not boot within {timeout} s: {self.console()[-3000:]}")

    def _find_leader(self) -> int | None:
        """The container's PID 1: the child of systemd-nspawn that runs systemd (nspawn forks an
        intermediate child first, which exits once it started the container's init)."""
        try:
            children = psutil.Process(self.process.pid).children()
        except psutil.NoSuchProcess:
            return None
        for child in children:
            try:
                if child.name() == "systemd":
                    return child.pid
            except psutil.NoSuchProcess:
                continue
        return None

    def run(self, command: str, user: str | None = None, check: bool = True, timeout: float = 300) -> subprocess.CompletedProcess:
        """Run a shell command line in the container (as root, or as ``user`` in that user's session environment)."""
        if user is not None:
            uid = self.run(f"id -u {user}").stdout.strip()
            command = (f"runuser -u {user} -- env HOME=/home/{user} USER={user} XDG_RUNTIME_DIR=/run/user/{uid} "
                       f"DBUS_SESSION_BUS_ADDRESS=unix:path=/run/user/{uid}/bus sh -c {shlex.quote(command)}")
        result = subprocess.run(
            ["nsenter", f"--target={self.leader}", "--all", "env", "-i", f"PATH={SYSTEM_PATH}", "LANG=C.UTF-8",
             "sh", "-c", command],
            capture_output=True, text=True, timeout=timeout,
        )
        if check and result.returncode != 0:
            raise AssertionError(f"`{command}` exited {result.returncode}:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}")
        return result

    def console(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def shutdown(self, timeout: float = 90) -> None:
        """Power the container off; kill it if it does not go."""
        if self.process is None or self.process.poll() is not None:
            return
        if self.leader:
            self.run("systemctl poweroff", check=False, timeout=30)
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            # SIGKILL to a PID namespace's init ends every process in it
            for pid in (self._find_leader(), self.process.pid):
                with contextlib.suppress(ProcessLookupError, TypeError):
                    os.kill(pid, signal.SIGKILL)
            self.process.wait(30)
