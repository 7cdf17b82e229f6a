"""The Textual shell: the app (bindings, actions, modes), its session, the palette and the widgets screens share."""
