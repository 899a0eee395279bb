"""The shape sweep's grid: the MLP shapes a pretraining run meets, per TP rank.

Axes: tokens per rank T (512 to 65536; 1000 for a T that is no multiple of a tile), model width
d (1024 to 8192), and the hidden size of one rank's shard: the global hidden size of the usual
model at that width, split over TP = 1, 2, 4 or 8 ranks. Global hidden sizes follow the common
recipes: Llama-style ``int(8/3 * d)`` rounded up to a multiple of 256 for swiglu (11008 at
d=4096, 13824 at d=5120, as Llama 2 7B and 13B), ``4 * d`` for gelu_tanh_approx (GPT-style).
A shard is then a multiple of 256 / TP (32 at TP 8) and its rows stay 16-byte aligned.

The full product (7 x 5 x 4 x 2 = 280 shapes) would take an hour of held timing; ``GRID`` picks
30 that cover the corners of each axis and the common shards at T=8192, in priority order (a
sweep cut short by its budget loses the last ones). T * d stays at or below ``MAX_T_TIMES_D``
(T=16384 at d=8192, T=65536 at d=2048): past it one step takes ~0.1 s and the MLP is far from
any launch or wave-quantization effect, so a larger shape says nothing the others do not.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..activations import get_activation
from .models import mlp_flops

TOKENS = (512, 1000, 2048, 4096, 8192, 16384, 65536)
WIDTHS = (1024, 2048, 4096, 5120, 8192)
TP_SIZES = (1, 2, 4, 8)
ACTIVATIONS = ("swiglu", "gelu_tanh_approx")
GATED_MULTIPLE = 256        # Llama's multiple_of for its 8/3 d hidden size
MAX_T_TIMES_D = 2 ** 27


def global_hidden(d: int, act: str) -> int:
    """The usual model's hidden size at width d: 8/3 d rounded up to 256 (gated), else 4 d."""
    if get_activation(act).gated:
        h = int(8 / 3 * d)
        return -(-h // GATED_MULTIPLE) * GATED_MULTIPLE
    return 4 * d


@dataclass(frozen=True)
class Shape:
    """One rank's MLP: T tokens of width d through its shard of a hidden size split over tp."""

    tokens: int
    d: int
    act: str
    tp: int = 1
    hidden: int = 0          # the global hidden size; 0: global_hidden(d, act)
    model: str = ""          # a model this shape is, when it is not the recipe's

    def __post_init__(self):
        if not self.hidden:
            object.__setattr__(self, "hidden", global_hidden(self.d, self.act))
        if self.hidden % self.tp:
            raise ValueError(f"hidden {self.hidden} is not divisible by TP {self.tp}")

    @property
    def shard(self) -> int:
        """This rank's hidden size: what its GEMMs see."""
        return self.hidden // self.tp

    @property
    def flops(self) -> float:
        return mlp_flops(self.tokens, self.d, self.act, self.shard)

    @property
    def label(self) -> str:
        of = f"TP{self.tp} of {self.hidden}" if self.tp > 1 else "TP1"
        model = f", {self.model}" if self.model else ""
        return f"T={self.tokens} d={self.d} {self.act} h={self.shard} ({of}{model})"


def _s(tokens, d, act, tp=1, **kw) -> Shape:
    return Shape(tokens, d, act, tp, **kw)


SWI, GELU = "swiglu", "gelu_tanh_approx"
GRID = (
    # The headline case, and the common shards at T=8192 (4096 tokens x 2 sequences, say).
    _s(8192, 4096, SWI, hidden=14336, model="Llama 3 8B"),
    _s(8192, 4096, SWI, 1), _s(8192, 4096, SWI, 2), _s(8192, 4096, SWI, 4), _s(8192, 4096, SWI, 8),
    _s(8192, 4096, GELU, 1), _s(8192, 4096, GELU, 8),
    _s(8192, 8192, SWI, 4), _s(8192, 8192, SWI, 8), _s(8192, 8192, GELU, 4),
    _s(8192, 5120, SWI, 1), _s(8192, 5120, SWI, 2),
    _s(8192, 2048, SWI, 1), _s(8192, 2048, GELU, 2), _s(8192, 1024, SWI, 1),
    # Fewer tokens: short sequences, small micro-batches, T that is no multiple of a tile.
    _s(512, 1024, SWI, 1), _s(512, 1024, GELU, 8), _s(512, 8192, SWI, 8),
    _s(1000, 4096, SWI, 1), _s(1000, 5120, GELU, 2),
    _s(2048, 2048, SWI, 2), _s(2048, 8192, GELU, 1),
    _s(4096, 5120, SWI, 4), _s(4096, 1024, GELU, 1),
    # More tokens, up to MAX_T_TIMES_D.
    _s(16384, 4096, SWI, 1), _s(16384, 8192, SWI, 2), _s(16384, 5120, GELU, 8),
    _s(65536, 1024, SWI, 1), _s(65536, 2048, SWI, 8), _s(65536, 1024, GELU, 4),
)

# --quick: the headline case, a TP=8 shard, and two short ones: about two minutes on an H200.
QUICK = (
    _s(8192, 4096, SWI, hidden=14336, model="Llama 3 8B"), _s(8192, 4096, GELU, 8),
    _s(512, 1024, SWI, 1), _s(1000, 5120, GELU, 2),
)

# --dry-run: the same recipes at tiny sizes, seconds on a CPU.
DRY_RUN = (
    _s(64, 64, SWI, 1), _s(100, 128, SWI, 2), _s(64, 128, GELU, 1), _s(100, 64, GELU, 4),
)
