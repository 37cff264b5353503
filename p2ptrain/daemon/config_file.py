"""The daemon's config as it is now, the file it lives in, and who follows its changes."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from p2ptrain.config import Config, save_config, with_value


class ConfigFile:
    """Holds the validated config; ``set`` changes one key, saves the file and tells the listeners.

    Args:
        path: the config file (``config.toml``).
        config: the config read from it at start.
    """

    def __init__(self, path: Path, config: Config):
        self.path, self.config = path, config
        self._listeners: list[Callable[[Config], None]] = []

    def on_change(self, listener: Callable[[Config], None]) -> None:
        """Call ``listener(config)`` after every change (what applies at once, such as the policies)."""
        self._listeners.append(listener)

    def set(self, key: str, value: Any) -> Config:
        """Set the dotted ``key`` to ``value`` and save the file atomically; returns the new config.

        Raises:
            ConfigError: an unknown key or an invalid value (its message says how to fix it).
            OSError: the file cannot be written (nothing changed).
        """
        config = with_value(self.config, key, value)
        save_config(config, self.path)
        self.config = config
        for listener in self._listeners:
            listener(config)
        return config
