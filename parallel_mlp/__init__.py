"""parallel-mlp: a Megatron-style tensor-parallel MLP with fused CuTe DSL kernels for Hopper."""

from .activations import ACTIVATIONS, Activation, get_activation
from .backends import BACKENDS
from .layer import ParallelMLP, parallel_mlp_func
from .params import merge_gate_up, split_gate_up
from .tp import allreduce_sequence_parallel_grads

__all__ = [
    "ACTIVATIONS",
    "Activation",
    "allreduce_sequence_parallel_grads",
    "BACKENDS",
    "ParallelMLP",
    "get_activation",
    "merge_gate_up",
    "parallel_mlp_func",
    "split_gate_up",
]
__version__ = "0.1.0"
