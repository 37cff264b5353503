"""The latest hardware reading, refreshed every few seconds for ``status``."""

from __future__ import annotations

import logging
import time

from p2ptrain.control_types import Hardware, Health
from p2ptrain.daemon.hardware_probe import HardwareFacts, probe


log = logging.getLogger(__name__)

REFRESH_S = 5.0


class HardwareView:
    """Caches ``hardware.probe()`` so that status calls never wait on NVML.

    Args:
        nvml: the pynvml module or a fake of it (the NVML boundary); None for the real one.
    """

    def __init__(self, nvml=None):
        self._nvml = nvml
        self._facts: HardwareFacts | None = None
        self._probed_at = 0.0

    def refresh_if_due(self) -> None:
        if time.monotonic() - self._probed_at < REFRESH_S and self._facts is not None:
            return
        self._probed_at = time.monotonic()
        try:
            self._facts = probe(nvml=self._nvml)
        except Exception:
            log.exception("hardware probe failed")

    def status(self) -> Hardware | None:
        self.refresh_if_due()
        return self._facts.to_status() if self._facts else None

    def health(self) -> list[Health]:
        return [Health(**line) for line in self._facts.health] if self._facts else []
