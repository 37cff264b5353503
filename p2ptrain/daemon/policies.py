"""Volunteer policies: when this machine lends its GPU or CPU, as BOINC and Folding@home volunteers expect.

`PolicySettings` (in `p2ptrain.config`) is the `[policy]` table of the config. `PolicyEngine.evaluate`
turns sensor readings into the `pause_reason` that applies now ('battery',
'temperature', 'traffic-budget', 'schedule', 'user-active', 'gpu-busy') or None. Nothing flaps:
a reason must hold for a while before some pauses start (another program on
the GPU), a pause lasts at least `min_pause_s`, and it ends only after its
condition has stayed clear for `resume_after_s` (the temperature also has to
drop below a lower resume threshold). `SystemSensors` reads the real machine;
`CachedSensors` reads it in a thread, so the daemon's event loop never waits
for a slow sensor (`loginctl` may take seconds).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
import subprocess
import threading
import time
from datetime import datetime
from pathlib import Path
from typing import Any, Callable, Protocol

from p2ptrain.config import PolicySettings
from p2ptrain.processes import WORKER_PROCESS_NAME

log = logging.getLogger(__name__)

SENSOR_READ_INTERVAL_S = 1.0

# When several reasons hold, the one shown is the first here: the most
# pressing for the volunteer (their battery, their hardware) first.
REASON_PRIORITY = ("battery", "temperature", "traffic-budget", "schedule", "user-active", "gpu-busy")


class Sensors(Protocol):
    """What the policies read. Each answer may be None: not measurable on this machine (the policy then holds back).

    `gpu_index`: the GPU this worker trains on, None for a CPU worker.
    """

    gpu_index: int | None

    def on_battery(self) -> bool | None: ...

    def user_idle_s(self) -> float | None: ...

    def gpu_temperature_c(self) -> float | None: ...

    def other_gpu_processes(self) -> list[dict] | None: ...


class PolicyEngine:
    """Decides, tick by tick, whether the volunteer's policies pause training and why.

    Args:
        settings: the volunteer's `PolicySettings`.
        sensors: where readings come from (`SystemSensors`, or a fake in tests).
        clock: monotonic seconds, for hold times and minimum durations.
        wallclock: local time now, for the schedule.
        monthly_traffic_gb: GB this machine's peers moved this calendar month (the daemon's
            `MonthlyTraffic.used_gb`), for `max_monthly_traffic_gb`.

    `evaluate()` is cheap enough for the supervisor's tick (every few seconds).
    After it, `detail` says in words why the current reason holds.
    """

    def __init__(self, settings: PolicySettings, sensors: Sensors, clock: Callable[[], float] = time.monotonic,
                 wallclock: Callable[[], datetime] = datetime.now,
                 monthly_traffic_gb: Callable[[], float] = lambda: 0.0):
        self.settings = settings
        self.monthly_traffic_gb = monthly_traffic_gb
        self.sensors = sensors
        self.clock = clock
        self.wallclock = wallclock
        self.detail: str | None = None
        self._active: dict[str, float] = {}  # reason -> when its pause began
        self._clear_since: dict[str, float] = {}  # active reason -> when its condition cleared
        self._trigger_since: dict[str, float] = {}  # inactive reason -> when its condition began
        self._details: dict[str, str] = {}

    @property
    def active_reasons(self) -> list[str]:
        """Every reason that holds now, most pressing first."""
        return [reason for reason in REASON_PRIORITY if reason in self._active]

    def evaluate(self) -> str | None:
        """The pause_reason that applies now, or None to train."""
        now = self.clock()
        conditions = self._conditions()
        for reason in [reason for reason in self._active if reason not in conditions]:
            del self._active[reason]  # its policy was switched off
            self._clear_since.pop(reason, None)
        for reason, (triggered, cleared, hold_s) in conditions.items():
            if reason in self._active:
                self._trigger_since.pop(reason, None)
                if not cleared:
                    self._clear_since.pop(reason, None)
                    continue
                cleared_at = self._clear_since.setdefault(reason, now)
                if (now - cleared_at >= self.settings.resume_after_s
                        and now - self._active[reason] >= self.settings.min_pause_s):
                    del self._active[reason]
                    del self._clear_since[reason]
            elif triggered:
                began = self._trigger_since.setdefault(reason, now)
                if now - began >= hold_s:
                    self._active[reason] = now
                    del self._trigger_since[reason]
            else:
                self._trigger_since.pop(reason, None)
        reasons = self.active_reasons
        self.detail = self._details.get(reasons[0]) if reasons else None
        return reasons[0] if reasons else None

    def _conditions(self) -> dict[str, tuple[bool, bool, float]]:
        """reason -> (condition holds, condition is clear, seconds it must hold before pausing)."""
        settings, sensors = self.settings, self.sensors
        uses_gpu = sensors.gpu_index is not None
        conditions: dict[str, tuple[bool, bool, float]] = {}
        if settings.pause_on_battery:
            battery = sensors.on_battery()
            conditions["battery"] = (battery is True, battery is not True, 0.0)
            self._details["battery"] = "running on battery; training resumes on mains power"
        if uses_gpu:
            temperature = sensors.gpu_temperature_c()
            hot = temperature is not None and temperature >= settings.max_gpu_temperature_c
            cool = temperature is None or temperature <= settings.resume_gpu_temperature_c
            conditions["temperature"] = (hot, cool, 0.0)
            self._details["temperature"] = (f"GPU at {temperature} C (limit {settings.max_gpu_temperature_c:g} C); "
                                            f"resumes at or below {settings.resume_gpu_temperature_c:g} C")
        if settings.max_monthly_traffic_gb is not None:
            used = self.monthly_traffic_gb()
            spent = used >= settings.max_monthly_traffic_gb
            conditions["traffic-budget"] = (spent, not spent, 0.0)
            self._details["traffic-budget"] = (
                f"this month's traffic budget is spent ({used:.2f} of {settings.max_monthly_traffic_gb:g} GB, "
                "policy.max_monthly_traffic_gb); training resumes next month or when you raise it")
        allowed = settings.allowed_at(self.wallclock())
        conditions["schedule"] = (not allowed, allowed, 0.0)
        self._details["schedule"] = "outside the scheduled hours (policy.schedule)"
        if settings.pause_gpu_when_user_active if uses_gpu else settings.pause_cpu_when_user_active:
            idle = sensors.user_idle_s()
            away_s = settings.user_idle_minutes * 60
            conditions["user-active"] = (idle is not None and idle < away_s, idle is None or idle >= away_s, 0.0)
            self._details["user-active"] = (f"the computer is in use; training resumes after "
                                            f"{settings.user_idle_minutes:g} minutes without input")
        if uses_gpu and settings.pause_when_gpu_busy:
            others = sensors.other_gpu_processes() or []
            conditions["gpu-busy"] = (bool(others), not others, settings.gpu_busy_after_s)
            if others:  # keep naming the last program seen while the pause waits out its hold times
                names = ", ".join(sorted({f"{p.get('name', '?')} ({p.get('pid')})" for p in others}))
                self._details["gpu-busy"] = f"another program uses the GPU: {names}"
        return conditions


class SystemSensors:
    """The real machine's sensors.

    - battery: psutil (None on machines without one);
    - user idle time: systemd-logind's idle hint of local sessions (works for
      the system service, under X11 and Wayland when the desktop reports idle,
      and on text consoles), else the X11 screensaver extension when $DISPLAY
      is set; None on a headless machine without logind, where pausing for the
      user is therefore never triggered (`idle_source` says which one works);
    - GPU temperature and other processes on the GPU: NVML.

    Args:
        gpu_index: the worker's GPU (NVML index), None for a CPU worker.
        own_pids: the pids of our own workers, which never count as "another program".
        nvml: the `pynvml` module or a fake; None imports it on first use.
    """

    def __init__(self, gpu_index: int | None = None, own_pids: Callable[[], set[int]] = set, nvml=None):
        self.gpu_index = gpu_index
        self.own_pids = own_pids
        self._nvml = nvml
        self._handle = None
        self.idle_source: str | None = None

    def on_battery(self) -> bool | None:
        import psutil

        battery = psutil.sensors_battery()
        if battery is None or battery.power_plugged is None:
            return None
        return not battery.power_plugged

    def user_idle_s(self) -> float | None:
        idle = _logind_idle_s()
        self.idle_source = "logind" if idle is not None else None
        if idle is None:
            idle = _x11_idle_s()
            self.idle_source = "x11" if idle is not None else None
        return idle

    def _gpu(self):
        if self._handle is None:
            if self._nvml is None:
                import pynvml

                self._nvml = pynvml
            self._nvml.nvmlInit()  # reference-counted by NVML: cheap to call once per sensor object
            self._handle = self._nvml.nvmlDeviceGetHandleByIndex(self.gpu_index)
        return self._nvml, self._handle

    def gpu_temperature_c(self) -> float | None:
        if self.gpu_index is None:
            return None
        try:
            nvml, handle = self._gpu()
            return float(nvml.nvmlDeviceGetTemperature(handle, 0))  # 0 = NVML_TEMPERATURE_GPU
        except Exception:  # the driver went away (reset, upgrade): unknown, not hot
            self._handle = None
            return None

    def other_gpu_processes(self) -> list[dict] | None:
        """Processes computing on our GPU that are not ours; display servers (graphics only) do not count,
        nor do other p2ptrain daemons' workers (``processes.WORKER_PROCESS_NAME``): two daemons on one GPU
        would otherwise pause each other for good, each taking the other's worker for the owner's program.
        Their memory is not free, so the plan of a worker started beside them already leaves it to them."""
        if self.gpu_index is None:
            return None
        try:
            nvml, handle = self._gpu()
            running = nvml.nvmlDeviceGetComputeRunningProcesses(handle)
        except Exception:
            self._handle = None
            return None
        ours = self.own_pids() | {os.getpid()}
        others = [{"pid": process.pid, "name": _process_name(process.pid)} for process in running if process.pid not in ours]
        return [other for other in others if other["name"] != WORKER_PROCESS_NAME]


class CachedSensors:
    """The latest readings of other sensors, taken in a background thread.

    The policy engine evaluates on the daemon's event loop every tick, and a
    reading can be slow (`loginctl` runs two commands with 2 s timeouts;
    NVML can hang with a wedged driver): reading here returns at once with
    the latest reading, and a thread takes new ones every `interval_s`. A
    sensor is read only once the engine has asked for it (a policy that is
    off never runs its command); until its first reading it answers None,
    so the policy holds back.

    Args:
        sensors: the sensors to read (`SystemSensors`).
        interval_s: seconds between two rounds of readings.
    """

    def __init__(self, sensors: Sensors, interval_s: float = SENSOR_READ_INTERVAL_S):
        self.sensors = sensors
        self.gpu_index = sensors.gpu_index
        self.interval_s = interval_s
        self._readers: dict[str, Callable[[], Any]] = {
            "on_battery": sensors.on_battery,
            "user_idle_s": sensors.user_idle_s,
            "gpu_temperature_c": sensors.gpu_temperature_c,
            "other_gpu_processes": sensors.other_gpu_processes,
        }
        self._readings: dict[str, Any] = {}
        self._wanted: set[str] = set()
        self._failing: set[str] = set()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def on_battery(self) -> bool | None:
        return self._latest("on_battery")

    def user_idle_s(self) -> float | None:
        return self._latest("user_idle_s")

    def gpu_temperature_c(self) -> float | None:
        return self._latest("gpu_temperature_c")

    def other_gpu_processes(self) -> list[dict] | None:
        return self._latest("other_gpu_processes")

    def close(self) -> None:
        """Stop the reading thread (it ends after the reading in progress)."""
        self._stop.set()

    def _latest(self, name: str) -> Any:
        if name not in self._wanted:
            self._wanted.add(name)
            if self._thread is None:
                self._thread = threading.Thread(target=self._read_forever, name="p2ptrain-sensors", daemon=True)
                self._thread.start()
        return self._readings.get(name)

    def _read_forever(self) -> None:
        while not self._stop.is_set():
            for name in list(self._wanted):
                self._readings[name] = self._read(name)
            self._stop.wait(self.interval_s)

    def _read(self, name: str) -> Any:
        try:
            reading = self._readers[name]()
        except Exception as error:  # a sensor that breaks means "unknown", never a dead thread
            if name not in self._failing:
                log.warning("cannot read the %s sensor: %s", name, error)
                self._failing.add(name)
            return None
        self._failing.discard(name)
        return reading


def _process_name(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return "?"


def _logind_idle_s() -> float | None:
    """Seconds since input in the most recently used local logind session; inf if none is open."""
    try:
        listing = subprocess.run(["loginctl", "list-sessions", "--no-legend"], capture_output=True, text=True,
                                 timeout=2)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if listing.returncode != 0:
        return None
    idle_times = []
    for line in listing.stdout.splitlines():
        session = line.split()[0] if line.split() else None
        if session is None:
            continue
        shown = subprocess.run(["loginctl", "show-session", session, "-p", "IdleHint", "-p",
                                "IdleSinceHintMonotonic", "-p", "Remote", "-p", "Class"],
                               capture_output=True, text=True, timeout=2)
        values = dict(item.split("=", 1) for item in shown.stdout.splitlines() if "=" in item)
        if values.get("Remote") == "yes" or values.get("Class") not in ("user", None):
            continue  # ssh logins and greeters are not someone at the keyboard
        if values.get("IdleHint") != "yes":
            idle_times.append(0.0)
            continue
        since_us = int(values.get("IdleSinceHintMonotonic") or 0)
        idle_times.append(max(0.0, time.monotonic() - since_us / 1e6))
    return min(idle_times) if idle_times else float("inf")


class _XScreenSaverInfo(ctypes.Structure):
    _fields_ = [("window", ctypes.c_ulong), ("state", ctypes.c_int), ("kind", ctypes.c_int),
                ("til_or_since", ctypes.c_ulong), ("idle", ctypes.c_ulong), ("eventMask", ctypes.c_ulong)]


def _x11_idle_s() -> float | None:
    """Milliseconds since input as the X server's screensaver extension counts them, in seconds."""
    if not os.environ.get("DISPLAY"):
        return None
    try:
        x11 = ctypes.CDLL(ctypes.util.find_library("X11") or "libX11.so.6")
        xss = ctypes.CDLL(ctypes.util.find_library("Xss") or "libXss.so.1")
    except OSError:
        return None
    x11.XOpenDisplay.restype = ctypes.c_void_p
    x11.XDefaultRootWindow.argtypes = [ctypes.c_void_p]
    x11.XDefaultRootWindow.restype = ctypes.c_ulong
    x11.XCloseDisplay.argtypes = [ctypes.c_void_p]
    xss.XScreenSaverAllocInfo.restype = ctypes.POINTER(_XScreenSaverInfo)
    xss.XScreenSaverQueryInfo.argtypes = [ctypes.c_void_p, ctypes.c_ulong, ctypes.POINTER(_XScreenSaverInfo)]
    display = x11.XOpenDisplay(None)
    if not display:
        return None
    try:
        info = xss.XScreenSaverAllocInfo()
        if not xss.XScreenSaverQueryInfo(display, x11.XDefaultRootWindow(display), info):
            return None
        idle_ms = info.contents.idle
        x11.XFree(info)
        return idle_ms / 1000
    finally:
        x11.XCloseDisplay(display)
