"""tpudash tests: unit (no Textual), functional (Pilot), benchmarks (not in the default run)."""
