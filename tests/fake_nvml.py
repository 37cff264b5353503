"""NVML faked at its boundary: this machine has no NVIDIA GPU, a volunteer's has.

``FakeNvml`` answers the `pynvml` functions the daemon calls for made-up cards
(``card``), in-process. ``fake_nvml_environment`` gives a daemon process the
same cards: it puts ``fake_nvml_module/pynvml.py`` first on ``PYTHONPATH``, so
the daemon's ``import pynvml`` finds the stand-in, which answers from the
cards written to a JSON file.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from types import SimpleNamespace

import pynvml  # the real one; in a daemon under test, the stand-in (which imports this module)

MIB = 1024**2
MODULE_DIRECTORY = Path(__file__).parent / "fake_nvml_module"
CARDS_VARIABLE = "P2PTRAIN_TEST_NVML_CARDS"


class FakeNvml:
    """The functions of `pynvml` that the probe calls, answering for made-up cards.

    Raises the real `pynvml.NVMLError` codes, as the library does.
    """

    def __init__(self, cards: list[dict], init_errors: list[int] = (), errors=pynvml):
        """``cards``: made with ``card``; ``init_errors``: NVML codes the first ``nvmlInit`` calls raise;
        ``errors``: where ``NVMLError`` and the constants come from (the real pynvml, or the stand-in module)."""
        self.errors = errors
        self.cards = cards
        self.init_errors = list(init_errors)
        self.init_calls = 0
        self.shutdowns = 0

    def nvmlInit(self):
        self.init_calls += 1
        if self.init_errors:
            raise self.errors.NVMLError(self.init_errors.pop(0))

    def nvmlShutdown(self):
        self.shutdowns += 1

    def nvmlDeviceGetCount(self):
        return len(self.cards)

    def nvmlDeviceGetHandleByIndex(self, index):
        return self.cards[index]

    def nvmlDeviceGetName(self, card):
        return card["name"]

    def nvmlDeviceGetUUID(self, card):
        return card["uuid"]

    def nvmlDeviceGetMemoryInfo(self, card):
        return SimpleNamespace(total=card["total"] * MIB, used=card["used"] * MIB,
                               free=(card["total"] - card["used"]) * MIB)

    def nvmlDeviceGetCudaComputeCapability(self, card):
        return card["capability"]

    def nvmlDeviceGetUtilizationRates(self, card):
        return SimpleNamespace(gpu=card["utilization"], memory=0)

    def nvmlDeviceGetTemperature(self, card, sensor):
        assert sensor == self.errors.NVML_TEMPERATURE_GPU
        return card["temperature"]

    def nvmlDeviceGetPowerUsage(self, card):
        return card["power_mw"]

    def nvmlDeviceGetEnforcedPowerLimit(self, card):
        return card["limit_mw"]

    def nvmlDeviceGetFanSpeed(self, card):
        if card.get("fan") is None:
            raise self.errors.NVMLError(self.errors.NVML_ERROR_NOT_SUPPORTED)  # passively cooled data-centre cards
        return card["fan"]

    def nvmlDeviceGetComputeRunningProcesses(self, card):
        return [SimpleNamespace(pid=pid, usedGpuMemory=used * MIB) for pid, used in card.get("compute", [])]

    def nvmlDeviceGetGraphicsRunningProcesses(self, card):
        return [SimpleNamespace(pid=pid, usedGpuMemory=None) for pid in card.get("graphics", [])]

    def nvmlSystemGetDriverVersion(self):
        return "550.54.15"

    def nvmlSystemGetNVMLVersion(self):
        return "12.550.54.15"


def card(name="NVIDIA GeForce RTX 4090", total=24564, used=1200, capability=(8, 9), **extra) -> dict:
    return {"name": name, "uuid": f"GPU-{name[-4:]}", "total": total, "used": used, "capability": capability,
            "utilization": 37, "temperature": 61, "power_mw": 123_456, "limit_mw": 450_000, "fan": 40, **extra}


def fake_nvml_environment(directory: Path, cards: list[dict]) -> dict:
    """Environment variables that make a daemon started with them see ``cards`` through NVML.

    Args:
        directory: where to write the cards (a test's temporary directory).
        cards: made with ``card``.
    """
    directory.mkdir(parents=True, exist_ok=True)
    cards_file = directory / "nvml-cards.json"
    cards_file.write_text(json.dumps(cards))
    path = os.pathsep.join(filter(None, [str(MODULE_DIRECTORY), str(Path(__file__).parent), os.environ.get("PYTHONPATH")]))
    return {"PYTHONPATH": path, CARDS_VARIABLE: str(cards_file)}
