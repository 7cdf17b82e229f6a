"""Unit tests: the core and the jobs, no Textual."""
