"""p2ptrain as a user installs a release: ``python -m build``, then the wheel in a fresh venv outside the source tree.

From that venv, with the source tree nowhere on the path: ``p2ptrain --version``,
``p2ptrain demo --duration 20`` (three daemons train and stop, leaving no
process), ``p2ptrain service install --user`` (the units come from the wheel)
and ``p2ptrain-tui`` (in a real terminal, and under Textual's driver, which
says where the styles came from). How the venv gets its dependencies without
downloading them: ``tests/release.py``.

Cost: about 2 minutes, most of it the demo (20 s of training, plus starting and
stopping three daemons on a loaded machine).
"""

from __future__ import annotations

import re
import subprocess
import sys
import tarfile
import textwrap
import time
import uuid
import zipfile
from pathlib import Path

import psutil
import pytest

from daemons import DaemonProcess, processes_marked, write_local_config
from p2ptrain import __version__
from release import SOURCE, build_release, install_wheel

sys.path.insert(0, str(Path(__file__).parents[1] / "tui"))
from tmux import TMUX, TmuxPane  # noqa: E402  (tests/tui's real terminal)

pytestmark = [pytest.mark.timeout(600)]

# What the installed package must hold besides its modules: the TUI's styles, the systemd files, the monitor's page.
PACKAGE_DATA = (
    "p2ptrain/tui/app.tcss",
    "p2ptrain/monitor/page.html",
    "p2ptrain/packaging/p2ptrain.service",
    "p2ptrain/packaging/p2ptrain-user.service",
    "p2ptrain/packaging/sysusers.d/p2ptrain.conf",
    "p2ptrain/packaging/tmpfiles.d/p2ptrain.conf",
)


@pytest.fixture(scope="module")
def release(tmp_path_factory):
    return build_release(tmp_path_factory.mktemp("release"))


@pytest.fixture(scope="module")
def installed(release, tmp_path_factory):
    return install_wheel(release.wheel, tmp_path_factory.mktemp("installed") / "venv")


@pytest.fixture
def elsewhere(tmp_path) -> Path:
    """A working directory outside the source tree, so nothing is imported from the checkout."""
    assert SOURCE not in tmp_path.parents
    return tmp_path


def test_the_sdist_and_the_wheel_hold_the_styles_and_the_systemd_units(release):
    with zipfile.ZipFile(release.wheel) as wheel:
        in_wheel = set(wheel.namelist())
    with tarfile.open(release.sdist) as sdist:
        in_sdist = {name.partition("/")[2] for name in sdist.getnames()}
    for name in PACKAGE_DATA:
        assert name in in_wheel, f"{name} is missing from the wheel"
        assert name in in_sdist, f"{name} is missing from the sdist"
    assert release.wheel.name == f"p2ptrain-{__version__}-py3-none-any.whl"
    assert f"p2ptrain-{__version__}.dist-info/licenses/LICENSE" in in_wheel and "LICENSE" in in_sdist
    entry_points = zipfile.ZipFile(release.wheel).read(f"p2ptrain-{__version__}.dist-info/entry_points.txt").decode()
    assert "p2ptrain = p2ptrain.cli:main" in entry_points and "p2ptrain-tui = p2ptrain.tui.app:main" in entry_points


def test_the_readme_names_the_wheel_this_version_builds(release):
    readme = (SOURCE / "README.md").read_text()
    named = set(re.findall(r"p2ptrain-[\w.]+-py3-none-any\.whl", readme))
    assert named == {release.wheel.name}, named


def test_the_installed_p2ptrain_is_the_wheel_and_says_its_version(installed, elsewhere):
    module_file = installed.installed_module_file(elsewhere)
    assert installed.site_packages in module_file.parents, module_file
    for name in PACKAGE_DATA:
        assert (installed.site_packages / name).is_file(), name
    result = installed.run(installed.script("p2ptrain"), "--version", cwd=elsewhere)
    assert (result.returncode, result.stdout.strip()) == (0, f"p2ptrain {__version__}"), result.stderr


def test_service_install_from_the_wheel_writes_the_packaged_user_unit(installed, elsewhere):
    config_home = elsewhere / "config"
    result = installed.run(installed.script("p2ptrain"), "service", "install", "--user", cwd=elsewhere,
                           extra_env={"XDG_CONFIG_HOME": str(config_home)})
    assert result.returncode == 0, result.stderr
    unit = (config_home / "systemd/user/p2ptrain.service").read_text()
    assert f"ExecStart={installed.bindir}/p2ptrain daemon" in unit
    assert unit.replace(f"{installed.bindir}", "@BINDIR@") == (SOURCE / "packaging/p2ptrain-user.service").read_text()
    assert "systemctl --user enable --now p2ptrain.service" in result.stdout


@pytest.mark.swarm
def test_the_installed_demo_trains_for_20_seconds_and_stops_everything(installed, elsewhere):
    mark = uuid.uuid4().hex
    demo = subprocess.Popen(
        [installed.script("p2ptrain"), "demo", "--duration", "20", "--ui", "text", "--dir", str(elsewhere / "demo")],
        cwd=elsewhere, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env=installed.environment({"P2PTRAIN_TEST_MARK": mark, "TMPDIR": str(elsewhere)}),
    )
    interpreters = set()
    try:
        # Which interpreter runs each of the demo's Python processes (daemons, workers), while they run.
        while demo.poll() is None:
            for process in processes_marked(mark):
                try:
                    command = process.cmdline()
                except (psutil.NoSuchProcess, psutil.ZombieProcess):
                    continue
                if command and "python" in Path(command[0]).name:
                    interpreters.add(command[0])
            time.sleep(0.5)
        output = demo.stdout.read()
    finally:
        if demo.poll() is None:
            demo.kill()
        demo.wait(30)
    assert demo.returncode == 0, output
    assert "run 'demo' (sync) created by peer0" in output, output
    assert "peer0: training" in output, output
    assert "stopping the demo's daemons" in output
    assert interpreters == {installed.python}, interpreters
    assert processes_marked(mark) == []


PILOT_SCRIPT = textwrap.dedent("""
    import asyncio, sys, time
    from p2ptrain.tui.app import P2PTrainApp
    from p2ptrain.tui.connection import find_daemon

    async def main(home, screenshot):
        app = P2PTrainApp(find_daemon(home))
        async with app.run_test(size=(120, 40)) as pilot:
            deadline = time.monotonic() + 60
            while getattr(app, "state", None) != "idle" and time.monotonic() < deadline:
                await pilot.pause(0.1)
            app.save_screenshot(screenshot)
            for path, _ in app.stylesheet.source:
                print("css", path)
            print("state", app.state)

    asyncio.run(main(sys.argv[1], sys.argv[2]))
""")


@pytest.fixture
def installed_daemon(installed, elsewhere):
    """An idle ``p2ptrain daemon`` of the installed venv."""
    home = elsewhere / "home"
    write_local_config(home)
    log_path = home / "daemon.log"
    with open(log_path, "w") as log_file:
        process = subprocess.Popen(
            [installed.script("p2ptrain"), "daemon", "--home", str(home)], cwd=elsewhere, stdout=log_file,
            stderr=subprocess.STDOUT, env=installed.environment(), start_new_session=True,
        )
    daemon = DaemonProcess(home, process, log_path)
    try:
        daemon.wait_until(lambda status: status["state"] == "idle", 60, what="the installed daemon to answer")
        yield daemon
    finally:
        daemon.terminate(timeout=20)
        daemon.kill()


def test_the_installed_tui_loads_its_packaged_styles_and_shows_the_daemon(installed, installed_daemon, elsewhere):
    screenshot = elsewhere / "tui.svg"
    result = installed.run(installed.python, "-c", PILOT_SCRIPT, str(installed_daemon.home), str(screenshot),
                           cwd=elsewhere, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "state idle" in result.stdout, result.stdout
    styles = [line.removeprefix("css ") for line in result.stdout.splitlines() if line.startswith("css ")]
    assert str(installed.site_packages / "p2ptrain/tui/app.tcss") in styles, styles
    assert "IDLE" in screenshot.read_text().replace("&#160;", " ")
    if TMUX is None:
        pytest.skip("tmux is not installed (apt-get install tmux): p2ptrain-tui was checked under Textual's driver only")
    command = ["env", "-u", "PYTHONPATH", f"--chdir={elsewhere}", installed.script("p2ptrain-tui"), "--home", str(installed_daemon.home)]
    with TmuxPane(120, 40) as pane:
        pane.run(command)
        pane.wait_for(lambda screen: "IDLE" in screen, timeout=60, what="the installed TUI showing the idle daemon")
        pane.send("q")
        pane.wait_for(lambda _: pane.exited, timeout=15, what="the TUI to exit")
