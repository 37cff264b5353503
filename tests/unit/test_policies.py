"""Volunteer policies with fake sensors and a fake clock: each pause_reason, hysteresis and minimum durations."""

from __future__ import annotations

from datetime import datetime

import pytest
from pydantic import ValidationError

from p2ptrain.config import PolicySettings
from p2ptrain.daemon.plan import PlanPolicy
from p2ptrain.daemon.policies import PolicyEngine


class FakeSensors:
    """Readings set by the test; None means "cannot measure here", as on the real machine."""

    def __init__(self, gpu_index: int | None = 0):
        self.gpu_index = gpu_index
        self.battery: bool | None = None
        self.idle_s: float | None = 3600.0
        self.temperature: float | None = 60.0
        self.others: list[dict] = []

    def on_battery(self):
        return self.battery

    def user_idle_s(self):
        return self.idle_s

    def gpu_temperature_c(self):
        return self.temperature

    def other_gpu_processes(self):
        return self.others


class FakeClock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


WEDNESDAY_NOON = datetime(2026, 11, 18, 12, 0)


def engine(sensors: FakeSensors, clock: FakeClock, **settings) -> PolicyEngine:
    moment = settings.pop("moment", WEDNESDAY_NOON)
    return PolicyEngine(PolicySettings(**settings), sensors, clock=clock, wallclock=lambda: moment)


def test_defaults_are_what_volunteers_expect():
    settings = PolicySettings()
    assert settings.pause_on_battery and settings.pause_gpu_when_user_active
    assert not settings.pause_cpu_when_user_active
    assert settings.resume_gpu_temperature_c < settings.max_gpu_temperature_c


def test_trains_when_nothing_objects():
    assert engine(FakeSensors(), FakeClock()).evaluate() is None


def test_battery_pauses_at_once_and_resumes_only_after_the_hold_times():
    sensors, clock = FakeSensors(), FakeClock()
    policies = engine(sensors, clock, min_pause_s=60, resume_after_s=30)
    sensors.battery = True
    assert policies.evaluate() == "battery"
    sensors.battery = False
    clock.advance(40)
    assert policies.evaluate() == "battery", "plugged in for 0 s: still within the hold"
    clock.advance(25)
    assert policies.evaluate() == "battery", "clear for 25 s < resume_after_s"
    clock.advance(10)
    assert policies.evaluate() is None


def test_a_flapping_condition_never_flaps_the_pause():
    sensors, clock = FakeSensors(), FakeClock()
    policies = engine(sensors, clock, min_pause_s=60, resume_after_s=30)
    sensors.battery = True
    policies.evaluate()
    reasons = []
    for tick in range(40):  # the charger contact bounces every 5 s for 200 s
        sensors.battery = tick % 2 == 0
        clock.advance(5)
        reasons.append(policies.evaluate())
    assert reasons == ["battery"] * 40


def test_temperature_pauses_above_the_limit_and_resumes_below_the_lower_one():
    sensors, clock = FakeSensors(), FakeClock()
    policies = engine(sensors, clock, max_gpu_temperature_c=83, resume_gpu_temperature_c=75, min_pause_s=0,
                      resume_after_s=0)
    sensors.temperature = 84
    assert policies.evaluate() == "temperature"
    assert "84" in policies.detail and "75" in policies.detail
    sensors.temperature = 80  # below the limit, above the resume threshold: the band that prevents flapping
    clock.advance(120)
    assert policies.evaluate() == "temperature"
    sensors.temperature = 74
    assert policies.evaluate() is None
    sensors.temperature = 80
    assert policies.evaluate() is None, "inside the band a running GPU keeps running"


def test_user_activity_pauses_the_gpu_but_not_the_cpu_by_default():
    gpu_sensors, cpu_sensors, clock = FakeSensors(), FakeSensors(gpu_index=None), FakeClock()
    gpu_policies = engine(gpu_sensors, clock, user_idle_minutes=3, min_pause_s=0, resume_after_s=0)
    cpu_policies = engine(cpu_sensors, clock, user_idle_minutes=3)
    gpu_sensors.idle_s = cpu_sensors.idle_s = 20
    assert gpu_policies.evaluate() == "user-active"
    assert cpu_policies.evaluate() is None
    gpu_sensors.idle_s = 179
    assert gpu_policies.evaluate() == "user-active"
    gpu_sensors.idle_s = 181
    assert gpu_policies.evaluate() is None


def test_unknown_idle_time_never_pauses():
    sensors = FakeSensors()
    sensors.idle_s = None  # headless: no logind, no X11
    assert engine(sensors, FakeClock()).evaluate() is None


def test_another_program_on_the_gpu_pauses_only_after_it_stays():
    sensors, clock = FakeSensors(), FakeClock()
    policies = engine(sensors, clock, gpu_busy_after_s=10, min_pause_s=0, resume_after_s=0)
    sensors.others = [{"pid": 4242, "name": "blender"}]
    assert policies.evaluate() is None
    clock.advance(5)
    sensors.others = []
    assert policies.evaluate() is None, "a 5 s blip does not pause"
    sensors.others = [{"pid": 4242, "name": "blender"}]
    assert policies.evaluate() is None
    clock.advance(11)
    assert policies.evaluate() == "gpu-busy"
    assert "blender (4242)" in policies.detail


def test_schedule_windows_per_weekday_and_across_midnight():
    settings = PolicySettings(schedule={"all": ["18:00-08:00"], "sat": ["00:00-24:00"], "sun": []})
    assert not settings.allowed_at(datetime(2026, 11, 18, 12, 0))  # Wednesday noon
    assert settings.allowed_at(datetime(2026, 11, 18, 23, 30))
    assert settings.allowed_at(datetime(2026, 11, 18, 7, 59))
    assert settings.allowed_at(datetime(2026, 11, 21, 12, 0))  # Saturday: all day
    assert not settings.allowed_at(datetime(2026, 11, 22, 23, 0))  # Sunday: never
    assert engine(FakeSensors(), FakeClock(), schedule={"all": ["18:00-08:00"]}).evaluate() == "schedule"


def test_the_most_pressing_reason_is_shown_and_the_next_takes_over():
    sensors, clock = FakeSensors(), FakeClock()
    policies = engine(sensors, clock, min_pause_s=0, resume_after_s=0)
    sensors.battery, sensors.idle_s = True, 5
    assert policies.evaluate() == "battery"
    assert policies.active_reasons == ["battery", "user-active"]
    sensors.battery = False
    assert policies.evaluate() == "user-active"


def test_switching_a_policy_off_ends_its_pause():
    sensors, clock = FakeSensors(), FakeClock()
    policies = engine(sensors, clock)
    sensors.battery = True
    assert policies.evaluate() == "battery"
    policies.settings.pause_on_battery = False
    assert policies.evaluate() is None


@pytest.mark.parametrize("bad", [{"schedule": {"someday": []}}, {"schedule": {"mon": ["9-17"]}},
                                 {"max_gpu_temperature_c": 70, "resume_gpu_temperature_c": 75},
                                 {"max_vram_share": 1.5}, {"pause_on_batery": True},
                                 {"max_compute_share": 0}, {"max_compute_share": 1.2}])
def test_bad_settings_are_refused(bad):
    with pytest.raises(ValidationError):
        PolicySettings(**bad)


def test_settings_shape_the_plan():
    policy = PlanPolicy.from_settings(PolicySettings(max_vram_share=0.5, max_cpu_threads=3, max_compute_share=0.25))
    assert (policy.memory_share, policy.max_cpu_threads, policy.compute_share) == (0.5, 3, 0.25)
    assert PlanPolicy.from_settings(PolicySettings()).compute_share == 1.0


def test_system_sensors_read_nvml_and_skip_our_own_workers():
    from types import SimpleNamespace

    from p2ptrain.daemon.policies import SystemSensors

    class Nvml:  # the pynvml functions the sensors call
        def nvmlInit(self):
            pass

        def nvmlDeviceGetHandleByIndex(self, index):
            return index

        def nvmlDeviceGetTemperature(self, handle, sensor):
            return 71

        def nvmlDeviceGetComputeRunningProcesses(self, handle):
            return [SimpleNamespace(pid=111, usedGpuMemory=0), SimpleNamespace(pid=222, usedGpuMemory=0)]

    sensors = SystemSensors(gpu_index=0, own_pids=lambda: {111}, nvml=Nvml())
    assert sensors.gpu_temperature_c() == 71.0
    assert [process["pid"] for process in sensors.other_gpu_processes()] == [222]


def test_another_daemons_worker_on_our_gpu_is_not_another_program():
    """Two daemons on one GPU paused each other for good (GPU findings, item 7): each saw the other's worker."""
    import subprocess
    import sys
    from types import SimpleNamespace

    from p2ptrain.daemon.policies import SystemSensors

    named_like_a_worker = "from p2ptrain.processes import name_this_process; import time; name_this_process(); print(flush=True); time.sleep(60)"
    programs = [subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
                for code in (named_like_a_worker, "import time; print(flush=True); time.sleep(60)")]
    try:
        for program in programs:
            program.stdout.readline()  # named (or not) by now

        class Nvml:
            def nvmlInit(self):
                pass

            def nvmlDeviceGetHandleByIndex(self, index):
                return index

            def nvmlDeviceGetComputeRunningProcesses(self, handle):
                return [SimpleNamespace(pid=program.pid, usedGpuMemory=0) for program in programs]

        others = SystemSensors(gpu_index=0, nvml=Nvml()).other_gpu_processes()
        assert [process["pid"] for process in others] == [programs[1].pid]
    finally:
        for program in programs:
            program.kill()
            program.wait(10)
    cpu_only = SystemSensors()
    assert cpu_only.gpu_temperature_c() is None and cpu_only.other_gpu_processes() is None


def test_cached_sensors_answer_at_once_while_a_slow_command_runs_in_their_thread(tmp_path, monkeypatch):
    import time

    from fake_commands import fake_loginctl

    from p2ptrain.daemon.policies import CachedSensors, SystemSensors

    monkeypatch.setenv("PATH", fake_loginctl(tmp_path, delay_s=0.5)["PATH"])
    sensors = CachedSensors(SystemSensors(), interval_s=0.1)
    try:
        started = time.monotonic()
        assert sensors.user_idle_s() is None  # no reading yet: the policy holds back
        readings = []
        while time.monotonic() - started < 10 and not readings:
            readings = [reading for reading in [sensors.user_idle_s()] if reading is not None]
            time.sleep(0.05)
        assert readings == [0.0]  # the fake session is in use
        calls = []
        for _ in range(20):
            call_started = time.monotonic()
            sensors.user_idle_s()
            calls.append(time.monotonic() - call_started)
        assert max(calls) < 0.05  # each loginctl call takes 0.5 s; a read never waits for one
        assert sensors.gpu_temperature_c() is None  # a CPU machine: nothing to read
    finally:
        sensors.close()


def test_a_sensor_that_fails_reads_as_unknown_and_the_others_go_on():
    import time

    from p2ptrain.daemon.policies import CachedSensors

    class BrokenBattery(FakeSensors):
        def on_battery(self):
            raise OSError("no /sys/class/power_supply")

    sensors = CachedSensors(BrokenBattery(), interval_s=0.05)
    try:
        sensors.on_battery(), sensors.gpu_temperature_c()
        deadline = time.monotonic() + 5
        while sensors.gpu_temperature_c() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert sensors.gpu_temperature_c() == 60.0 and sensors.on_battery() is None
        policy = PolicyEngine(PolicySettings(), sensors)
        assert policy.evaluate() is None
    finally:
        sensors.close()
