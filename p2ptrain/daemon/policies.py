"""Volunteer policies: when this machine lends its GPU or CPU, as BOINC and Folding@home volunteers expect.

`PolicySettings` is the `[policy]` table of the config. `PolicyEngine.evaluate`
turns sensor readings into the `pause_reason` that applies now ('battery',
'temperature', 'traffic-budget', 'schedule', 'user-active', 'gpu-busy') or None. Nothing flaps:
a reason must hold for a while before some pauses start (another program on
the GPU), a pause lasts at least `min_pause_s`, and it ends only after its
condition has stayed clear for `resume_after_s` (the temperature also has to
drop below a lower resume threshold). `SystemSensors` reads the real machine.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import re
import subprocess
import time
from datetime import datetime
from pathlib import Path
from typing import Callable, Protocol

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from p2ptrain.daemon.plan import PlanPolicy

# When several reasons hold, the one shown is the first here: the most
# pressing for the volunteer (their battery, their hardware) first.
REASON_PRIORITY = ("battery", "temperature", "traffic-budget", "schedule", "user-active", "gpu-busy")
WEEKDAYS = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")
_WINDOW = re.compile(r"^([01]\d|2[0-4]):([0-5]\d)-([01]\d|2[0-4]):([0-5]\d)$")


class Sensors(Protocol):
    """What the policies read. Each answer may be None: not measurable on this machine (the policy then holds back).

    `gpu_index`: the GPU this worker trains on, None for a CPU worker.
    """

    gpu_index: int | None

    def on_battery(self) -> bool | None: ...

    def user_idle_s(self) -> float | None: ...

    def gpu_temperature_c(self) -> float | None: ...

    def other_gpu_processes(self) -> list[dict] | None: ...


class PolicySettings(BaseModel):
    """The `[policy]` table of config.toml: when to lend the machine, and how much of it.

    Defaults follow BOINC: pause on battery, GPU paused while the user is
    active (input in the last 3 minutes), CPU keeps training at idle priority.
    `schedule` maps "all" or a weekday ("mon".."sun", overriding "all") to
    windows "HH:MM-HH:MM" when training may run; a window whose end is before
    its start wraps past midnight ("22:00-07:00"); an empty schedule means any
    time, an empty list for a day means never that day.
    """

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    pause_on_battery: bool = True
    pause_gpu_when_user_active: bool = True
    pause_cpu_when_user_active: bool = False
    user_idle_minutes: float = Field(3.0, gt=0, description="no input for this long means the user is away")
    pause_when_gpu_busy: bool = Field(True, description="pause while another program computes on our GPU")
    gpu_busy_after_s: float = Field(10.0, ge=0, description="another program must hold the GPU this long")
    max_gpu_temperature_c: float = Field(83.0, ge=40, le=110, description="pause at or above this temperature")
    resume_gpu_temperature_c: float = Field(75.0, ge=20, le=110, description="resume at or below this one")
    schedule: dict[str, list[str]] = Field(default_factory=dict)
    max_vram_share: float = Field(0.9, gt=0, le=1, description="share of free GPU memory training may take")
    max_ram_share: float = Field(0.5, gt=0, le=1, description="share of available RAM for CPU training")
    max_cpu_threads: int | None = Field(None, ge=1, description="cap on CPU threads (unset: all cores)")
    max_monthly_traffic_gb: float | None = Field(
        None, gt=0, description="pause training once this machine's peers sent and received this many GB "
        "this calendar month (unset: no limit); the DHT stays up, so a few KB/s go on while paused")
    min_pause_s: float = Field(60.0, ge=0, description="a pause lasts at least this long")
    resume_after_s: float = Field(30.0, ge=0, description="a reason must stay clear this long to resume")

    @field_validator("schedule")
    @classmethod
    def _check_schedule(cls, schedule: dict[str, list[str]]) -> dict[str, list[str]]:
        for day, windows in schedule.items():
            if day not in WEEKDAYS and day != "all":
                raise ValueError(f"schedule day {day!r} is unknown; use 'all' or one of {', '.join(WEEKDAYS)}")
            for window in windows:
                if not _WINDOW.match(window):
                    raise ValueError(f"schedule window {window!r} is not HH:MM-HH:MM, e.g. '18:00-08:00'")
        return schedule

    @model_validator(mode="after")
    def _resume_below_pause(self) -> PolicySettings:
        if self.resume_gpu_temperature_c >= self.max_gpu_temperature_c:
            raise ValueError(f"resume_gpu_temperature_c ({self.resume_gpu_temperature_c}) must be below "
                             f"max_gpu_temperature_c ({self.max_gpu_temperature_c}), e.g. 8 degrees lower")
        return self

    def plan_policy(self) -> PlanPolicy:
        """The caps that shape the hardware plan."""
        return PlanPolicy(memory_share=self.max_vram_share, ram_share=self.max_ram_share,
                          max_cpu_threads=self.max_cpu_threads)

    def allowed_at(self, moment: datetime) -> bool:
        """True when the schedule lets training run at `moment` (local wall-clock time)."""
        if not self.schedule:
            return True
        day = WEEKDAYS[moment.weekday()]
        windows = self.schedule.get(day, self.schedule.get("all"))
        if windows is None:
            return True
        minute = moment.hour * 60 + moment.minute
        return any(_in_window(minute, window) for window in windows)


def _in_window(minute: int, window: str) -> bool:
    match = _WINDOW.match(window)
    start = int(match.group(1)) * 60 + int(match.group(2))
    end = int(match.group(3)) * 60 + int(match.group(4))
    if start <= end:
        return start <= minute < end
    return minute >= start or minute < end  # wraps past midnight


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
        """Processes computing on our GPU that are not ours; display servers (graphics only) do not count."""
        if self.gpu_index is None:
            return None
        try:
            nvml, handle = self._gpu()
            running = nvml.nvmlDeviceGetComputeRunningProcesses(handle)
        except Exception:
            self._handle = None
            return None
        ours = self.own_pids() | {os.getpid()}
        return [{"pid": process.pid, "name": _process_name(process.pid)}
                for process in running if process.pid not in ours]


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
