"""Importable benchmark code: each module's `main(argv)` is what `scripts/bench_<name>.py` runs (and
`scripts/learning_curves.py`, `scripts/testbed_report.py`); `shapes.SHAPES` is the one table of model shapes.
Nothing here is imported by `mathrl_jax`; the numbers it prints are in docs/benchmarks.md and docs/real_shapes.md.
"""
