"""The systemd units as systemd itself reads them, and `p2ptrain service install`."""

from __future__ import annotations

import os
import shlex
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from p2ptrain import cli
from p2ptrain.service import (
    ServiceInstallError,
    install_service,
    packaged_file,
    planned_files,
    render_unit,
    uninstall_service,
)

REPO_PACKAGING = Path(__file__).resolve().parents[2] / "packaging"
needs_systemd_analyze = pytest.mark.skipif(
    shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed (package systemd)"
)


@pytest.fixture
def venv_bindir() -> str:
    """The directory of the real p2ptrain script installed next to this interpreter."""
    script = shutil.which("p2ptrain", path=os.path.dirname(sys.executable))
    if script is None:
        pytest.skip("p2ptrain is not installed in this environment (pip install -e .)")
    return os.path.dirname(script)


@pytest.fixture
def system_bindir(tmp_path) -> str:
    """A bin directory outside /home whose p2ptrain runs the real one.

    The venv's own script cannot serve for the system service when its
    interpreter lives under /home or /root (ProtectHome=yes hides it), which
    is the case on many development machines.
    """
    bindir = tmp_path / "opt-bin"
    bindir.mkdir()
    real = shutil.which("p2ptrain", path=os.path.dirname(sys.executable)) or "p2ptrain"
    script = bindir / "p2ptrain"
    script.write_text(f'#!/bin/sh\nexec {shlex.quote(real)} "$@"\n')
    script.chmod(0o755)
    return str(bindir)


def verify(unit_file: Path, user: bool, tmp_path: Path) -> list[str]:
    """Run `systemd-analyze verify` and return what it says about our unit (empty when clean)."""
    command = ["systemd-analyze"] + (["--user"] if user else []) + ["verify", str(unit_file)]
    environment = dict(os.environ)
    if user:
        # The user manager needs a runtime directory even to verify.
        runtime = tmp_path / "xdg-runtime"
        runtime.mkdir(mode=0o700)
        environment["XDG_RUNTIME_DIR"] = str(runtime)
    result = subprocess.run(command, capture_output=True, text=True, env=environment, timeout=60)
    complaints = [line for line in (result.stdout + result.stderr).splitlines() if "p2ptrain" in line]
    if result.returncode != 0 and not complaints:
        complaints = [f"exit status {result.returncode}: {result.stderr.strip()}"]
    return complaints


def unit_lines(text: str) -> set[str]:
    return {line.strip() for line in text.splitlines() if line.strip() and not line.startswith("#")}


@needs_systemd_analyze
@pytest.mark.timeout(60)
def test_system_unit_passes_systemd_analyze_verify(tmp_path, venv_bindir):
    unit_file = tmp_path / "p2ptrain.service"
    unit_file.write_text(render_unit((REPO_PACKAGING / "p2ptrain.service").read_text(), venv_bindir))
    assert verify(unit_file, user=False, tmp_path=tmp_path) == []


@needs_systemd_analyze
@pytest.mark.timeout(60)
def test_user_unit_passes_systemd_analyze_verify(tmp_path, venv_bindir):
    unit_file = tmp_path / "p2ptrain.service"
    unit_file.write_text(render_unit((REPO_PACKAGING / "p2ptrain-user.service").read_text(), venv_bindir))
    assert verify(unit_file, user=True, tmp_path=tmp_path) == []


@needs_systemd_analyze
@pytest.mark.timeout(60)
def test_verify_reports_a_unit_whose_script_is_missing(tmp_path):
    unit_file = tmp_path / "p2ptrain.service"
    unit_file.write_text(render_unit((REPO_PACKAGING / "p2ptrain.service").read_text(), "/nonexistent/bin"))
    complaints = verify(unit_file, user=False, tmp_path=tmp_path)
    assert any("/nonexistent/bin/p2ptrain" in line for line in complaints), complaints


def test_system_unit_runs_the_daemon_with_system_paths_at_idle_priority(venv_bindir):
    lines = unit_lines(render_unit(packaged_file("p2ptrain.service").read_text(), venv_bindir))
    assert f"ExecStart={venv_bindir}/p2ptrain daemon" in lines
    expected = {
        "Type=notify", "NotifyAccess=main", "WatchdogSec=60", "Environment=P2PTRAIN_SYSTEM=1",
        "User=p2ptrain", "Group=p2ptrain", "Nice=19", "IOSchedulingClass=idle", "ProtectSystem=strict",
        "StateDirectory=p2ptrain", "RuntimeDirectory=p2ptrain", "RuntimeDirectoryMode=0750",
        "WantedBy=multi-user.target",
    }  # fmt: skip
    assert expected <= lines, expected - lines


def test_packaged_files_are_the_ones_in_packaging():
    for relative in ("p2ptrain.service", "p2ptrain-user.service", "sysusers.d/p2ptrain.conf", "tmpfiles.d/p2ptrain.conf"):
        assert packaged_file(relative).read_bytes() == (REPO_PACKAGING / relative).read_bytes()


def test_user_install_writes_the_unit_into_the_config_dir(tmp_path, venv_bindir, monkeypatch):
    monkeypatch.setenv("HOME", "/home/volunteer")
    monkeypatch.delenv("XDG_CONFIG_HOME", raising=False)
    root = tmp_path / "root"
    commands = install_service(user=True, bindir=venv_bindir, root=str(root))

    unit_file = root / "home/volunteer/.config/systemd/user/p2ptrain.service"
    assert f"ExecStart={venv_bindir}/p2ptrain daemon" in unit_lines(unit_file.read_text())
    assert stat.S_IMODE(unit_file.stat().st_mode) == 0o644
    assert [path for path in root.rglob("*") if path.is_file()] == [unit_file]
    assert commands[:2] == ["systemctl --user daemon-reload", "systemctl --user enable --now p2ptrain.service"]


def test_user_install_honours_xdg_config_home(tmp_path, venv_bindir, monkeypatch):
    monkeypatch.setenv("XDG_CONFIG_HOME", "/srv/config")
    install_service(user=True, bindir=venv_bindir, root=str(tmp_path))
    assert (tmp_path / "srv/config/systemd/user/p2ptrain.service").is_file()


def test_dry_run_writes_nothing_but_plans_the_files(tmp_path, venv_bindir, monkeypatch):
    monkeypatch.setenv("HOME", "/home/volunteer")
    monkeypatch.delenv("XDG_CONFIG_HOME", raising=False)
    commands = install_service(user=True, bindir=venv_bindir, dry_run=True, root=str(tmp_path))
    assert "systemctl --user enable --now p2ptrain.service" in commands
    assert list(tmp_path.iterdir()) == []
    planned = planned_files(user=True, bindir=venv_bindir, root=str(tmp_path))
    assert list(planned) == [tmp_path / "home/volunteer/.config/systemd/user/p2ptrain.service"]


def test_bindir_defaults_to_the_running_installation(tmp_path, venv_bindir, monkeypatch):
    monkeypatch.setattr(sys, "argv", [os.path.join(venv_bindir, "p2ptrain"), "service", "install"])
    monkeypatch.setenv("HOME", "/home/volunteer")
    monkeypatch.delenv("XDG_CONFIG_HOME", raising=False)
    install_service(user=True, root=str(tmp_path))
    unit_file = tmp_path / "home/volunteer/.config/systemd/user/p2ptrain.service"
    assert f"ExecStart={venv_bindir}/p2ptrain daemon" in unit_lines(unit_file.read_text())


@pytest.mark.skipif(os.geteuid() != 0, reason="systemd-tmpfiles must chown to the new p2ptrain user: needs root")
@pytest.mark.skipif(
    not all(shutil.which(tool) for tool in ("systemd-sysusers", "systemd-tmpfiles", "systemctl")),
    reason="systemd-sysusers, systemd-tmpfiles and systemctl are needed (package systemd)",
)
@pytest.mark.timeout(60)
def test_system_install_into_a_root_then_its_commands_create_user_dirs_and_enable(tmp_path, system_bindir):
    root = tmp_path / "root"
    commands = install_service(user=False, bindir=system_bindir, root=str(root))
    for command in commands:
        subprocess.run(shlex.split(command), check=True, capture_output=True, timeout=30)

    users = {line.split(":")[0]: line.split(":") for line in (root / "etc/passwd").read_text().splitlines()}
    groups = {line.split(":")[0] for line in (root / "etc/group").read_text().splitlines()}
    assert users["p2ptrain"][5] == "/var/lib/p2ptrain"
    assert {"p2ptrain", "video", "render"} <= groups
    for directory in ("run/p2ptrain", "var/lib/p2ptrain"):
        info = (root / directory).stat()
        assert (stat.S_IMODE(info.st_mode), info.st_uid) == (0o750, int(users["p2ptrain"][2]))
    wants = root / "etc/systemd/system/multi-user.target.wants/p2ptrain.service"
    assert os.readlink(wants) == "/etc/systemd/system/p2ptrain.service"
    assert f"ExecStart={system_bindir}/p2ptrain daemon" in unit_lines((root / "etc/systemd/system/p2ptrain.service").read_text())


def test_system_install_without_root_says_to_use_sudo_or_user(monkeypatch, system_bindir):
    # The one fake: this test machine runs as root, a volunteer usually does not.
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    with pytest.raises(ServiceInstallError, match=r"sudo p2ptrain service install.*--user"):
        install_service(user=False, bindir=system_bindir)


def test_user_install_under_sudo_is_refused(monkeypatch, venv_bindir):
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    monkeypatch.setenv("SUDO_USER", "volunteer")
    with pytest.raises(ServiceInstallError, match="without sudo"):
        install_service(user=True, bindir=venv_bindir)


def test_system_install_refuses_an_interpreter_hidden_by_protect_home(tmp_path):
    bindir = tmp_path / "bin"
    bindir.mkdir()
    script = bindir / "p2ptrain"
    script.write_text("#!/home/volunteer/venv/bin/python\n")
    script.chmod(0o755)
    with pytest.raises(ServiceInstallError, match=r"/home/volunteer/venv/bin/python.*--user"):
        install_service(user=False, bindir=str(bindir), root=str(tmp_path / "root"))
    assert not (tmp_path / "root").exists()


@pytest.mark.parametrize("name", ["my bin", "100%", "$HOME"])
def test_bindir_systemd_would_misread_is_refused(tmp_path, name):
    bindir = tmp_path / name
    bindir.mkdir()
    (bindir / "p2ptrain").write_text("#!/bin/sh\n")
    (bindir / "p2ptrain").chmod(0o755)
    with pytest.raises(ServiceInstallError, match="without spaces"):
        install_service(user=True, bindir=str(bindir), root=str(tmp_path / "root"))


def test_bindir_without_the_script_is_refused(tmp_path):
    with pytest.raises(ServiceInstallError, match=r"no executable p2ptrain in .*--bindir"):
        install_service(user=True, bindir=str(tmp_path), root=str(tmp_path / "root"))



def test_uninstall_removes_the_user_unit_and_its_enable_link_and_keeps_the_state(tmp_path, venv_bindir, monkeypatch):
    monkeypatch.setenv("HOME", "/home/volunteer")
    monkeypatch.delenv("XDG_CONFIG_HOME", raising=False)
    install_service(user=True, bindir=venv_bindir, root=str(tmp_path))
    unit_dir = tmp_path / "home/volunteer/.config/systemd/user"
    wants = unit_dir / "default.target.wants"
    wants.mkdir()
    (wants / "p2ptrain.service").symlink_to(unit_dir / "p2ptrain.service")  # what `systemctl --user enable` made
    state = tmp_path / "home/volunteer/.local/state/p2ptrain/metrics.db"
    state.parent.mkdir(parents=True)
    state.write_text("kept")

    planned, _ = uninstall_service(user=True, dry_run=True, root=str(tmp_path))
    assert (unit_dir / "p2ptrain.service").exists() and set(planned) == {unit_dir / "p2ptrain.service", wants / "p2ptrain.service"}
    removed, commands = uninstall_service(user=True, root=str(tmp_path))
    assert set(removed) == set(planned)
    assert not (unit_dir / "p2ptrain.service").exists() and not os.path.lexists(wants / "p2ptrain.service")
    assert state.read_text() == "kept"
    assert "daemon-reload" in commands[-1]
    with pytest.raises(ServiceInstallError, match="no p2ptrain --user service is installed here"):
        uninstall_service(user=True, root=str(tmp_path))


def test_uninstall_removes_every_system_file(tmp_path, system_bindir):
    root = tmp_path / "root"
    install_service(user=False, bindir=system_bindir, root=str(root))
    removed, _ = uninstall_service(user=False, root=str(root))
    assert sorted(path.relative_to(root).as_posix() for path in removed) == [
        "etc/systemd/system/p2ptrain.service", "etc/sysusers.d/p2ptrain.conf", "etc/tmpfiles.d/p2ptrain.conf"]
    assert not [path for path in root.rglob("*") if path.is_file()]


def test_uninstall_refuses_bindir_in_one_line_and_removes_nothing(tmp_path, venv_bindir, monkeypatch, capsys):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.delenv("SUDO_USER", raising=False)
    install_service(user=True, bindir=venv_bindir)
    unit_file = tmp_path / "config/systemd/user/p2ptrain.service"
    assert unit_file.exists()

    assert cli.main(["service", "uninstall", "--user", "--bindir", venv_bindir]) == cli.EXIT_USAGE
    error = capsys.readouterr().err
    assert "--bindir is only for install" in error and "drop --bindir" in error
    assert error.count("\n") == 1
    assert unit_file.exists()
    assert cli.main(["service", "uninstall", "--user"]) == cli.EXIT_OK
    assert not unit_file.exists()


def test_uninstall_of_the_system_service_without_root_says_to_use_sudo(monkeypatch):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)  # this test machine runs as root; a volunteer usually does not
    with pytest.raises(ServiceInstallError, match="sudo p2ptrain service uninstall"):
        uninstall_service(user=False)
