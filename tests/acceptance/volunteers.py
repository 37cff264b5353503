"""A volunteer's machine as the README sets it up: a user account, the user service's daemon, no ``--home`` anywhere.

Each volunteer is a home directory with its own XDG directories, so the
README's commands run exactly as written (``p2ptrain status``, not
``p2ptrain --home ... status``), against the daemon the installed user unit
starts, with the default configuration (no config file).
"""

from __future__ import annotations

import configparser
import shlex
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from daemons import P2PTRAIN, DaemonProcess, child_environment
from p2ptrain.protocol import ControlClient


@dataclass
class Volunteer(DaemonProcess):
    """One volunteer account; ``process`` is its daemon once ``start_service`` ran."""

    environment: dict = field(default_factory=dict)

    @classmethod
    def create(cls, root: Path) -> Volunteer:
        """A fresh account whose home is ``root``."""
        environment = child_environment({
            "HOME": str(root),
            "XDG_CONFIG_HOME": str(root / ".config"),
            "XDG_STATE_HOME": str(root / ".local/state"),
            "XDG_CACHE_HOME": str(root / ".cache"),
            "XDG_DATA_HOME": str(root / ".local/share"),
            "XDG_RUNTIME_DIR": str(root / "run"),
            "USER": "volunteer",
        })
        environment.pop("SUDO_USER", None)
        (root / "run").mkdir(parents=True, mode=0o700)
        return cls(home=root, process=None, log_path=root / "daemon.log", environment=environment)

    @property
    def client(self) -> ControlClient:
        return ControlClient(str(Path(self.environment["XDG_RUNTIME_DIR"]) / "p2ptrain" / "control.sock"), timeout=10)

    @property
    def state_dir(self) -> Path:
        return Path(self.environment["XDG_STATE_HOME"]) / "p2ptrain"

    def run(self, command: list[str], cwd: Path | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
        """Run a README command line as this volunteer (``p2ptrain`` is the installed script)."""
        if command[0] == "p2ptrain":
            command = [*P2PTRAIN, *command[1:]]
        return subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=self.environment, cwd=cwd or self.home)

    def unit_file(self) -> Path:
        return Path(self.environment["XDG_CONFIG_HOME"]) / "systemd/user/p2ptrain.service"

    def start_service(self) -> None:
        """What ``systemctl --user enable --now p2ptrain`` does with the installed unit: run its ExecStart with its Environment."""
        unit = configparser.ConfigParser(strict=False, interpolation=None)
        unit.optionxform = str
        unit.read_string(self.unit_file().read_text())
        service = unit["Service"]
        environment = dict(self.environment)
        environment.update(dict(item.split("=", 1) for item in shlex.split(service.get("Environment", ""))))
        with open(self.log_path, "a") as log_file:
            self.process = subprocess.Popen(shlex.split(service["ExecStart"]), stdout=log_file, stderr=subprocess.STDOUT,
                                            env=environment, cwd=self.home, start_new_session=True)
        self.wait_until(lambda status: True, timeout=60, interval=0.2, what="the service's daemon to answer")

    def stop(self) -> None:
        """End the daemon (SIGTERM, then SIGKILL of everything left), as the test's cleanup."""
        if self.process is not None:
            self.terminate(timeout=60)
            self.kill()
