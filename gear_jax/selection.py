"""What a selection is: the `Sample` of picked rows and the names of the selection methods.

Shared by the jitted calls (`gear_jax.ops`), the host calls (`gear_jax.host`), the PyTorch bridge and the
sharded layer; the checks of a Sample live in `gear_jax._args`.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax

from gear_jax import _native

# Selection methods by name, with the number the custom call carries: defined once, in the native
# module (kernels/sample.h), so Python and the kernels cannot disagree.
METHODS: dict[str, int] = dict(_native.sample_methods())

# The methods whose answer is an order of the rows rather than a draw (no key needed for the rows).
ORDERED_METHODS = ("fifo", "lifo", "topk")

PICK_BYTES = 20  # per pick: index, generation, probability, start, length


@dataclasses.dataclass(frozen=True)
class Sample:
    """Rows picked by `sample`.

    Attributes:
      indices: int32[B] row ids.
      generations: uint32[B] each row's generation when it was picked; `gather` and
        `update_priorities` use it to detect rows overwritten since.
      probabilities: float32[B] probability of picking the row (uniform: 1/V for V selectable rows;
        prioritized: p^a / sum p^a; fifo, lifo, topk: 1).
      starts: int32[B] first step of each window (0 without a window).
      selectable: int32 scalar, the count N of selectable rows when the sample ran (uniform: the N of
        its probabilities 1/N), so that importance weights (N * P)^-beta need nothing else; None for
        samples that `sample` did not make (`sample_at`, `ordered_candidates`, hand-built ones).
      lengths: int32[B] each picked row's length (in a step ring: its episode's length) as read when it
        was picked (0 for a failed pick); meaningful where `gather` finds the row valid. With
        `starts`, where each window lies in its episode. None where `selectable` is.
      window: static int, the window length given to `sample` (0 for none).
      table_handle: static int, the handle of the table the rows were picked from (None for samples
        built by hand): `gather` and `update_priorities` refuse a sample of another table. It is part of
        the pytree structure; a `lax.scan` carry that starts from a hand-built sample can drop it with
        `sample.detached()`.
    """

    indices: jax.Array
    generations: jax.Array
    probabilities: jax.Array
    starts: jax.Array
    selectable: Any = None
    lengths: Any = None
    window: int = 0
    table_handle: int | None = None

    def detached(self) -> Sample:
        """The same picks without the table's handle (as a hand-built sample; no table check)."""
        return dataclasses.replace(self, table_handle=None)


jax.tree_util.register_dataclass(
    Sample,
    data_fields=["indices", "generations", "probabilities", "starts", "selectable", "lengths"],
    meta_fields=["window", "table_handle"],
)
