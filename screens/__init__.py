"""One Textual Screen per module, each with its .tcss beside it."""
