"""The benchmark scripts, run as files (``python benchmarks/benchmark.py``); what they share is
``benchmarks.common``. A package so that the checkout's copy is the one imported."""
