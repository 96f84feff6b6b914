"""Benchmarks: commands that print one JSON object each (``asr-bench ...``)."""
