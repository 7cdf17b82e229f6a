"""Functional tests: the Textual app driven by Pilot."""
