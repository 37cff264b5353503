"""p2ptrain: donate a GPU (or CPU) to peer-to-peer training runs on hivemind."""

__version__ = "0.1.0"
