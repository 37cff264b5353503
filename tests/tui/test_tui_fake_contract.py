"""The TUI's fake daemon answers as the real one does: the same requests, the same answers.

The TUI's tests run against ``fake_daemon.FakeDaemon``; this test keeps it
honest. One sequence of control requests (a status, the verbs in and out of a
run, bad requests) goes to the fake and to a real ``p2ptrain daemon`` (a sync
run of the tiny model alone on 127.0.0.1), and the answers must agree: the
shape of every status (its keys, nested), the state, the pause reason, and
the code, message and fix of every error. When this fails, fix the fake
(unless the real daemon is wrong).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, fields

import pytest
from fake_daemon import FakeDaemon
from fake_data import idle_status, training_status

from p2ptrain.daemon.hardware_probe import GpuFacts
from p2ptrain.protocol import ControlClient, DaemonError

pytestmark = pytest.mark.timeout(300)

RUN = "contract"
NEW_RUN = {"run": RUN, "new_run": True, "manifest": {"model": "tiny", "target_batch_size": 64}}


def drift(real, fake, path: str = "result") -> list[str]:
    """Where two JSON values differ in shape: keys one has and the other lacks, or a dict against a list.

    Values may differ (the fake's are canned); a null matches anything (a loss
    not reported yet), and lists are compared by their first items when both
    have one (the real daemon here has no GPU, the fake's has one).
    """
    if isinstance(real, dict) and isinstance(fake, dict):
        problems = [f"{path}.{key}: only the {side} daemon has it"
                    for side, mine, theirs in (("real", real, fake), ("fake", fake, real)) for key in sorted(set(mine) - set(theirs))]
        return problems + [problem for key in sorted(set(real) & set(fake)) for problem in drift(real[key], fake[key], f"{path}.{key}")]
    if isinstance(real, list) and isinstance(fake, list):
        return drift(real[0], fake[0], f"{path}[0]") if real and fake else []
    if real is None or fake is None or isinstance(real, (dict, list)) == isinstance(fake, (dict, list)):
        return []
    return [f"{path}: the real daemon sends {type(real).__name__}, the fake {type(fake).__name__}"]


@dataclass
class Side:
    """One daemon under test: its client, and how to wait for what its training worker does by itself."""

    client: ControlClient
    wait_until_training: Callable[[], None]
    wait_until_idle: Callable[[], None]


def answer(side: Side, method: str, params: dict) -> dict:
    """The daemon's answer to one request: the error, or the status with its state pulled out."""
    try:
        result = side.client.call(method, **params)
    except DaemonError as error:
        return {"error": {"code": error.code, "message": error.message, "fix": error.fix}}
    return {
        "state": result["state"],
        "pause_reason": result["pause_reason"],
        "timed pause": result["paused_until"] is not None,
        "run": (result["run"] or {}).get("id"),
        "local": result["local"] is not None,
        "status": result,
    }


def differences(method: str, params: dict, real: dict, fake: dict) -> list[str]:
    request = f"{method} {json.dumps(params)}"
    plain = {key: value for key, value in real.items() if key != "status"}
    if plain != {key: value for key, value in fake.items() if key != "status"}:
        return [f"{request}:\n  real: {json.dumps(plain)}\n  fake: {json.dumps({k: v for k, v in fake.items() if k != 'status'})}"]
    return [f"{request}: {problem}" for problem in drift(real.get("status"), fake.get("status"), "status")]


def drive(side: Side) -> list[tuple[str, dict, dict]]:
    """The sequence: (method, params, answer) for every request."""
    answers = []

    def ask(method: str, **params) -> None:
        answers.append((method, params, answer(side, method, params)))

    ask("status")
    for verb in ("pause", "resume", "finish", "leave"):
        ask(verb)  # not in a run
    ask("explode")
    ask("join", run=5)
    ask("join", run=RUN)  # an existing run, but no bootstrap address
    ask("join", **NEW_RUN)
    ask("join", **NEW_RUN)  # already in it
    side.wait_until_training()
    ask("status")
    ask("pause", for_s="soon")
    ask("pause", for_s=0.5)
    ask("pause")
    ask("pause", for_s=90)
    ask("finish")  # already paused
    ask("resume")
    ask("resume")  # not paused: nothing to do, no error
    ask("finish")
    ask("leave")
    side.wait_until_idle()
    ask("status")
    ask("pause")
    return answers


def fake_side(fake: FakeDaemon) -> Side:
    client = ControlClient(str(fake.socket_path))

    def idle() -> None:
        deadline = time.monotonic() + 10
        while client.call("status")["state"] != "idle":
            assert time.monotonic() < deadline, "the fake daemon did not become idle after leave"
            time.sleep(0.05)

    return Side(client, fake.worker_joined, idle)


@pytest.mark.swarm
def test_the_fake_daemon_answers_as_the_real_daemon_does(daemons, tmp_path):
    real = daemons.start()
    real_side = Side(
        real.client,
        lambda: real.wait_until(lambda status: status["state"] == "training", 180, what="training"),
        lambda: real.wait_until(lambda status: status["state"] == "idle", 120, what="idle after leave"),
    )
    real_answers = drive(real_side)
    with FakeDaemon(tmp_path / "fake", idle_status()) as fake:
        fake_answers = drive(fake_side(fake))
    found = [
        problem
        for (method, params, real_answer), (_, _, fake_answer) in zip(real_answers, fake_answers)
        for problem in differences(method, params, real_answer, fake_answer)
    ]
    assert not found, "the fake daemon (tests/tui/fake_daemon.py) drifted from the real one:\n" + "\n".join(found)


def test_the_fake_gpu_has_the_fields_of_the_real_probe():
    # The real daemon of the test above runs where there is no GPU: the fake's GPU row is checked here.
    assert set(training_status()["hardware"]["gpus"][0]) == {field.name for field in fields(GpuFacts)}
