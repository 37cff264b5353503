"""The TUI's dialogs and help screen."""
