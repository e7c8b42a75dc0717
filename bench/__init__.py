"""Benchmarks: each module runs as `python -m bench.<name>` from the repository root and
prints its figures; bench/README.md says what each measures and keeps the measured tables."""
