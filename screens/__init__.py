"""One Textual Screen per module, each with its .tcss beside it (History's pushed screens share history.tcss).

The app's modes (``tpudash.tui.modes``) name them; a screen's module is
imported only when its mode is first shown, so this package imports nothing.
``base`` is the frame every screen shares and ``stored_runs`` what the
screens of runs on disk share. Screens import the shell's widgets
(``tpudash.tui``); the shell never imports a screen.
"""
