"""The daemon's private temporary directory: taken afresh at start, given back at a clean stop."""

from __future__ import annotations

import os
import tempfile

from p2ptrain.daemon.temp_files import daemon_temp_dir, give_back_temp_dir, take_temp_dir, worker_temp_dir
from p2ptrain.paths import resolve_paths


def test_a_start_removes_what_a_killed_daemon_left_and_a_clean_stop_leaves_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv("TMPDIR", tempfile.gettempdir())
    monkeypatch.setattr(tempfile, "tempdir", None)
    paths = resolve_paths(tmp_path / "home")
    paths.create()
    other = resolve_paths(tmp_path / "other")
    assert daemon_temp_dir(paths) != daemon_temp_dir(other)  # named after the state directory
    leftover = worker_temp_dir(paths, "cpu") / "hivemind-p2pd-killed.sock"
    leftover.parent.mkdir(parents=True)
    leftover.touch()
    try:
        directory = take_temp_dir(paths)
        assert directory == daemon_temp_dir(paths) and list(directory.iterdir()) == []
        assert os.environ["TMPDIR"] == str(directory) and tempfile.gettempdir() == str(directory)
        assert (paths.state_dir / "temp-dir").read_text().strip() == str(directory)
        assert len(os.fsencode(worker_temp_dir(paths, "gpu12") / "hivemind-p2pclient-XXXXXXXXXXX.sock")) < 107
        give_back_temp_dir(paths)
        assert not directory.exists() and not (paths.state_dir / "temp-dir").exists()
    finally:
        give_back_temp_dir(paths)
