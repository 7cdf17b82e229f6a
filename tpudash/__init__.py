"""tpudash: a terminal cockpit for TensorFlow accelerator sessions.

This module holds the version only: importing tpudash must import neither
tensorflow nor textual, so the CLI and the TUI can show something at once.
"""

__version__ = "0.1.0"
