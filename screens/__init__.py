"""One Textual Screen per module, each with its .tcss beside it.

The app's modes (``tpudash.tui.modes``) name them; a screen's module is
imported only when its mode is first shown, so this package imports nothing.
"""
