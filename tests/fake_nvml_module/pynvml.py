"""Stands in for nvidia-ml-py's ``pynvml`` in a daemon process under test (``fake_nvml.fake_nvml_environment``).

Answers every NVML function the daemon calls from the cards in the JSON file
named by ``P2PTRAIN_TEST_NVML_CARDS`` (``fake_nvml.FakeNvml``), and raises
``NVMLError`` with the real library's codes.
"""

import json
import os

NVML_ERROR_UNINITIALIZED = 1
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NO_PERMISSION = 4
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_TEMPERATURE_GPU = 0


class NVMLError(Exception):
    def __init__(self, value: int):
        super().__init__(f"NVML error {value}")
        self.value = value


import fake_nvml  # noqa: E402  (it imports this module as pynvml: the names above must exist first)

with open(os.environ[fake_nvml.CARDS_VARIABLE]) as cards_file:
    _cards = [{**card, "capability": tuple(card["capability"])} for card in json.load(cards_file)]
_nvml = fake_nvml.FakeNvml(_cards, errors=__import__(__name__))


def __getattr__(name: str):
    return getattr(_nvml, name)
