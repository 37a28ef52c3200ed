"""Benchmark scripts (run them as files: `python benchmarks/attention.py --help`); helpers in `common`."""
