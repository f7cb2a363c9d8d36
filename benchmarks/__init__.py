"""Performance and sample-efficiency benchmarks (JSON under ``benchmarks/results/``; not timed tests).

Run ``python -m benchmarks all [--quick]`` or ``python -m benchmarks <name> [--quick]``.
"""
