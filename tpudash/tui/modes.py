"""The app's modes: mode → (screen module, class, label, what it shows).

The app imports a screen's module only when its mode is first shown, so this
module imports nothing.
"""

MODE_SCREENS = {
    "devices": ("screens.devices", "DevicesScreen", "Devices", "the runtime, strategy and logical devices"),
    "jobs": ("screens.jobs", "JobsScreen", "Jobs", "every job with its parameter form"),
    "run": ("screens.run", "RunScreen", "Run view", "the live view of this session's runs"),
    "history": ("screens.history", "HistoryScreen", "History", "past runs: open, overlay, export"),
    "log": ("screens.log", "SessionLogScreen", "Session log", "TensorFlow's native log and notifications"),
    "help": ("screens.help", "HelpScreen", "Help", "keys and what tpudash keeps"),
}
