"""Adapters that put ParallelMLP into other frameworks' models. Each lives in its own module and
imports its framework when that module is imported; ``import parallel_mlp`` never does."""
