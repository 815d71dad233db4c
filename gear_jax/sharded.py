"""Sharded replay: one table per device along a mesh axis, sampled inside `jax.shard_map`.

A `ShardedTable` has S shards, shard s living in the host memory of the process that owns device s of
the mesh axis (pinned for CUDA where present). Each shard is an ordinary gear_jax `Table` named
`<name>.shard<s>`: actors on a host attach to their host's shards by that name and insert as into any
table. A global row id names the shard and the row: `shard * capacity + row` (int32).

Selection runs inside `jax.shard_map` over the axis (`sample`, `update_priorities`), or through the
wrappers that build the `shard_map` (`ShardedTable.sampler`, `ShardedTable.updater`). Modes:

- `global`: the law of one table holding every shard's rows (uniform, or prioritized p_i^a / sum p^a).
  Each shard reduces its weights to one total; the S totals are all-gathered; every device draws the
  same B uniforms from the common key, finds each pick's shard from the inclusive cumulative sum of the
  totals (the same arithmetic on every device), and the owning shard finds the row (`gear_jax.ops
  .sample_at`). Rows reach their consumer (pick j goes to device j // (B / S)) through one `all_to_all`
  of static shape (XLA:CPU has no ragged all-to-all): every device knows from the common key how many
  of each consumer's picks each shard owns, so each shard packs its picks for each consumer into a
  block of C slots, gathers those rows only, and sends S blocks. C is the first of a few compiled
  capacities (`exchange_capacities`: ceil(1.5 B / S^2) + 4, larger ones, then B / S, which always fits)
  that holds the fullest block; every device takes the same branch (`exchange_branch`), so the result
  is exactly that of full-size blocks whatever the shards' shares.
  fifo, lifo and topk in `global` mode are decentralized: each shard's K = min(B, capacity) best rows
  are its candidates (`gear_jax.ops.ordered_candidates`), their 8-byte order keys are all-gathered (S x K
  keys), every device sorts them the same way and keeps the B best, and only the winners' rows move,
  through the same exchange; B may exceed one shard's capacity, up to the S x capacity rows of all.
  topk equals one table holding every shard's rows in shard-major order (priority descending, ties to
  the lower global row id). Shards have no common clock, so fifo orders by each
  shard's commit count, ties to the lower shard: the k-th row committed to any shard comes before the
  (k+1)-th row of any shard (time order when shards fill at the same rate); lifo is fifo's reverse.
- `local`: each device draws B / S picks from its own shard; no row moves. `probabilities` is the true
  probability that a slot holds the row, (1 / S) * p_i^a / W_s, so importance weights stay unbiased
  (fifo, lifo, topk: each shard's own B / S best, probability 1).

Bytes per step on each device (b = B / S picks per device, R bytes per gathered row, C the capacity
of the step's branch):
- global uniform / prioritized: one all_gather of S float32 totals and S int32 counts (8 S bytes of
  selection traffic), then the all_to_all of S blocks of C rows and pick fields (S C (R + 17) bytes
  sent: 16 bytes of pick fields and the `valid` byte, packed with the rows into one buffer). The picked
  rows are b (R + 17) bytes per device on average; with shards of equal weight C is the first capacity
  in all but a tiny share of steps (at S = 4, B = 1024: C = 100, S C = 400 rows sent for 256 picked,
  where full-size blocks sent 1,024; a step overflows 100 with probability under 5e-6), and a shard
  holding more of the weight takes a larger C;
- global fifo / lifo / topk: the same plus the all_gather of S x K order keys (8 S K bytes, K =
  min(B, capacity));
- local: the psum of one count; no rows move.

`ShardedSample.selectable` is the global count N of selectable rows; `importance_weights` forms
(N * P)^-beta normalized by the maximum over the global batch.

Shards may be step rings (`TableSpec(..., step_capacity=N)`); every mode and method works on them.
Global uniform windows whose law does not weigh every row alike (a step ring's, where every valid window
start is equally likely, and short_episodes="skip", where rows without a window are never picked) weigh
each shard by its total under that law (`total_weight(..., window=W)`: its count of valid window starts,
or of rows offering a window), draw each pick's owner by those totals, and each shard then draws the
picks it owns from its own table by the one-table law (`sample` of B picks, the k-th it owns taking the
k-th): a shard's share times the law within it is the law of one table holding every shard's rows. Each
shard then samples B picks rather than B / S (the selection, not the gather: only owned picks are read);
a shard that empties between its total and its draw raises as an empty table does.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import math
import os
import secrets
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from gear_jax import _agreement, _args, _rows, ops
from gear_jax.selection import ORDERED_METHODS, Sample
from gear_jax.errors import InvalidArgumentError, TableClosedError
from gear_jax.spec import TableSpec
from gear_jax.table import Table

MODES = ("global", "local")
# The compact exchange of global mode (module docstring, "Bytes per step"): each (source shard,
# consumer) block holds ceil(CAPACITY_FACTOR x B / S^2) + EXCHANGE_SLACK picks in its first branch, more
# in the next ones, B / S in the last (which always fits).
CAPACITY_FACTOR = 1.5
EXCHANGE_SLACK = 4
EXCHANGE_BRANCHES = 4
SHARDED_METHODS = ("uniform", "prioritized", *ORDERED_METHODS)
MAX_GLOBAL_ROWS = 2**31 - 1


@dataclasses.dataclass(frozen=True)
class ShardedSample:
    """The picks one device consumes (B / S of them) of a sharded sample.

    Attributes:
      indices: int32[b] global row ids (`shard * capacity + row`).
      generations: uint32[b] each row's generation when it was picked.
      probabilities: float32[b] probability that the slot holds the row (global: p_i^a / W over every
        shard; local: p_i^a / (S * W_s)).
      starts: int32[b] first step of each window (0 without a window).
      selectable: int32 scalar, the selectable rows of every shard together (N).
      window: static int, the window length (0 for none).
    """

    indices: jax.Array
    generations: jax.Array
    probabilities: jax.Array
    starts: jax.Array
    selectable: jax.Array
    window: int = 0


jax.tree_util.register_dataclass(
    ShardedSample,
    data_fields=["indices", "generations", "probabilities", "starts", "selectable"],
    meta_fields=["window"],
)


def shard_name(name: str, shard: int) -> str:
    """The shared-memory name of shard `shard` of the sharded table `name`."""
    return f"{name}.shard{int(shard)}"


def _detached(tree: Any) -> Any:
    """`tree` with every Sample's table handle dropped: each shard is its own table, and the branches of
    the switch over a process's shards must return the same structure. The sharded layer routes every
    pick to the shard that owns it (ShardedSample row ids are global)."""
    is_sample = lambda x: isinstance(x, Sample)  # noqa: E731
    return jax.tree_util.tree_map(lambda x: x.detached() if is_sample(x) else x, tree, is_leaf=is_sample)


class ShardedTable:
    """S tables, one per device along `axis` of `mesh`, each in its owner process's host memory.

    Create it with `ShardedTable.create` on every process of the job (each creates only its own
    shards). It is static in jitted code (hashable by identity), like `Table`.
    """

    def __init__(
        self,
        spec: TableSpec,
        mesh: Mesh,
        axis: str,
        name: str,
        devices: Sequence[Any],
        shards: dict[int, Table],
    ):
        self.spec = spec
        self.mesh = mesh
        self.axis = axis
        self.name = name
        self.devices = list(devices)
        self._shards = dict(sorted(shards.items()))
        self._local_ids = np.asarray(list(self._shards), np.int32)
        # The `metadata` the checkpoint it was loaded from was saved with (ShardedTable.load), else None.
        self.checkpoint_metadata: dict[str, Any] | None = None

    # -- creating and closing ---------------------------------------------------------------------

    @classmethod
    def create(
        cls,
        spec: TableSpec,
        mesh: Mesh,
        axis: str = "replay",
        name: str | None = None,
        pin: bool = True,
        reuse: bool = True,
        max_times_sampled: int | None = None,
    ) -> ShardedTable:
        """Creates this process's shards; call it on every process with the same spec and mesh.

        Args:
          spec: every shard's `TableSpec` (capacity is per shard); must be equal on every process.
          mesh: the device mesh; `axis` must be one of its axes, and its other axes must have size 1.
          axis: the mesh axis the shards lie along (one shard per device).
          name: the sharded table's name (shards are `<name>.shard<s>`); by default process 0 draws one
            and every process takes it.
          pin: as in `Table.create`, for each shard.
          reuse: as in `Table.create`, for each shard.
          max_times_sampled: as in `Table.create`, for each shard (the same on every process): each
            shard counts the samples of its own rows. Works with local mode and with global uniform and
            prioritized sampling; global fifo, lifo and topk are refused on such a table (their shards
            take candidates that the exchange may not deliver).

        Raises (on every process, whichever process it concerns: the process at fault raises its own
        error, the others an error of the same kind naming that process and its cause, never a
        collective left waiting for a process that already raised):
          InvalidArgumentError: `axis` is not an axis of the mesh, another axis has size > 1, the global
            row ids would not fit in int32, the spec or name differ across processes, or a process's
            arguments are of the wrong type.
          Any error of `Table.create` on a process (the shards already made elsewhere are closed).
        """
        op = "ShardedTable.create"
        # Every step that can fail on one process runs inside an agreement (gear_jax/_agreement.py): a
        # process that raised before a collective would leave the others waiting in it.
        error, devices = None, []
        try:
            devices = mesh_devices(spec, mesh, axis, op)
            if name is not None and not isinstance(name, str):
                raise InvalidArgumentError(f"{op}: name must be a str, got {type(name).__name__}")
        except Exception as e:
            error = e
        name = agreed_name(spec if error is None else None, name, error, op)
        me = jax.process_index()
        shards: dict[int, Table] = {}
        error = None
        try:
            for s, device in enumerate(devices):
                if device.process_index == me:
                    shards[s] = Table.create(
                        spec,
                        name=shard_name(name, s),
                        pin=pin,
                        reuse=reuse,
                        max_times_sampled=max_times_sampled,
                    )
        except Exception as e:
            error = e
        try:
            _agreement.agree(error, op)
        except BaseException:
            for table in shards.values():
                table.close()
            raise
        return cls(spec, mesh, axis, name, devices, shards)

    # -- checkpoints (gear_jax/sharded_checkpoint.py) -----------------------------------------------

    def save(self, path: str | os.PathLike[str], metadata: dict[str, Any] | None = None) -> None:
        """Writes a crash-safe checkpoint of every shard under the directory `path`; call it on every
        process of the job at the same point (it synchronizes them). `metadata`, a small JSON dict (the
        training step, say), is kept with the checkpoint and comes back as `checkpoint_metadata` of the
        table `load` returns. Each process writes its own shards
        (`Table.save`'s format, streamed and CRC-32'd; rows written meanwhile are saved as `Table.save`
        saves them), and the new checkpoint replaces the previous one only once every process's shards
        are durable: a process killed at any moment (or every process) leaves the previous checkpoint
        loadable. `path` may be on a shared file system or a directory of the same name on each host.
        See `gear_jax.sharded_checkpoint`.

        Raises (on every process, naming the process at fault):
          CheckpointError: `path` holds something other than a sharded checkpoint, its parent does not
            exist, or a shard could not be written (a full disk, say).
          InvalidArgumentError: `metadata` is not a dict of JSON values.
        """
        from gear_jax import sharded_checkpoint

        sharded_checkpoint.save(self, path, metadata)

    @classmethod
    def load(
        cls,
        path: str | os.PathLike[str],
        mesh: Mesh,
        axis: str = "replay",
        name: str | None = None,
        pin: bool = True,
    ) -> ShardedTable:
        """The sharded table of the newest checkpoint under `path` that every process can read, in new
        shards over `mesh` (each process loads the shards of its devices, with their rows, priorities,
        generations, insert order and cursors: `Table.load` for each). Call it on every process of the
        job; `axis`, `name` and `pin` are `create`'s. The table's `checkpoint_metadata` is the `metadata`
        the checkpoint was saved with.

        Raises (on every process, naming the process at fault):
          CheckpointError: no checkpoint every process can read (each process must find its shards
            under `path`), a damaged one, or one of another number of shards than the mesh has devices
            along `axis` (rows are not redistributed).
          InvalidArgumentError: as `create`.
        """
        from gear_jax import sharded_checkpoint

        return sharded_checkpoint.load(path, mesh, axis=axis, name=name, pin=pin)

    @staticmethod
    def attach_shard(name: str, shard: int) -> Table:
        """Attaches to shard `shard` of the sharded table `name` (an actor on the shard's host)."""
        return Table.attach(shard_name(name, shard))

    def close(self) -> None:
        """Closes this process's shards."""
        for table in self._shards.values():
            table.close()

    def __enter__(self) -> ShardedTable:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # -- what it holds ----------------------------------------------------------------------------

    @property
    def num_shards(self) -> int:
        return len(self.devices)

    @property
    def capacity(self) -> int:
        """Rows per shard."""
        return self.spec.capacity

    @property
    def max_times_sampled(self) -> int | None:
        """The shards' `max_times_sampled` (None: no limit)."""
        return next(iter(self._shards.values())).max_times_sampled if self._shards else None

    @property
    def local_shards(self) -> dict[int, Table]:
        """This process's shards, by shard index."""
        return dict(self._shards)

    def shard(self, s: int) -> Table:
        """This process's shard `s` (raises for a shard another process owns)."""
        op = "ShardedTable.shard"
        if isinstance(s, (bool, np.bool_)) or not isinstance(s, (int, np.integer)):
            raise InvalidArgumentError(
                f"{op}: s must be a shard index, an int in [0, {self.num_shards}), got {type(s).__name__}; "
                "local_shards maps this process's shard indices to their tables"
            )
        if not 0 <= s < self.num_shards:
            raise InvalidArgumentError(
                f"{op}: s={s} is not a shard of {self.name!r}, whose {self.num_shards} shards (one per "
                f"device along {self.axis!r}) are numbered 0 to {self.num_shards - 1}; local_shards maps "
                "this process's shard indices to their tables"
            )
        if s not in self._shards:
            raise InvalidArgumentError(
                f"ShardedTable.shard: shard {s} of {self.name!r} lives in process "
                f"{self.devices[s].process_index}, not in this one ({jax.process_index()}); attach there"
            )
        return self._shards[s]

    def global_rows(self, shard: Any, rows: Any) -> np.ndarray:
        """Global row ids of `rows` of shard `shard`."""
        return np.asarray(shard, np.int64) * self.capacity + np.asarray(rows, np.int64)

    def split_rows(self, global_rows: Any) -> tuple[np.ndarray, np.ndarray]:
        """(shard, row) of global row ids."""
        g = np.asarray(global_rows, np.int64)
        return g // self.capacity, g % self.capacity

    def _check_open(self, op: str) -> None:
        """Refuses a call on a table whose shards (this process's) were closed: a compiled call would
        dispatch, fail asynchronously on the devices, and its failure would come back at exit."""
        for s, table in self._shards.items():
            if table.closed:
                raise TableClosedError(
                    f"{op}: shard {s} of the sharded table {self.name!r} is closed; a compiled sampler or "
                    "updater reads the shards it was made for: create or load the sharded table again and "
                    "make new ones from it"
                )

    # -- inside shard_map -------------------------------------------------------------------------

    def _on_my_shard(self, fn: Callable[[Table], Any]) -> Any:
        """fn(this device's shard), inside shard_map over the axis. A process traces one branch per
        shard it owns; each device runs the one of its shard."""
        tables = list(self._shards.values())
        if not tables:
            raise InvalidArgumentError(f"{self.name!r}: this process owns no shard of the mesh axis")
        if len(tables) == 1:
            return _detached(fn(tables[0]))
        me = lax.axis_index(self.axis)
        branch = jnp.clip(jnp.searchsorted(jnp.asarray(self._local_ids), me), 0, len(tables) - 1)
        return lax.switch(branch, [lambda t=t: _detached(fn(t)) for t in tables])

    # -- wrappers that build the shard_map ----------------------------------------------------------

    def sampler(self, batch_size: int, **kwargs: Any) -> Callable[[Any], tuple[ShardedSample, dict]]:
        """A jitted function key -> (ShardedSample, batch) over the whole mesh: `sample` inside a
        shard_map. Outputs are global arrays of B picks sharded along the axis; `selectable` is
        replicated. `kwargs` are `sample`'s (method, mode, priority_exponent, window, fields). The key is
        a PRNG key (`jax.random.key`), its raw key data or an int seed, the same on every process, on any
        device or sharding (a traced key in the caller's jit too); it is replicated on the mesh."""
        window = _args.check_window(kwargs.get("window"), self.spec.max_steps, "ShardedTable.sampler")

        def body(key_data: jax.Array) -> tuple[ShardedSample, dict]:
            return sample(self, jax.random.wrap_key_data(key_data), batch_size, **kwargs)

        row = P(self.axis)
        fields = kwargs.get("fields") or list(self.spec.fields)
        out_specs = (
            ShardedSample(row, row, row, row, P(), window=window),
            {f: row for f in [*fields, "valid"]},
        )
        mapped = jax.shard_map(body, mesh=self.mesh, in_specs=P(), out_specs=out_specs, check_vma=False)
        # The key replicated on the mesh, as the shard_map takes it (a traced key of the caller's jit may
        # carry another sharding, which a mesh of Explicit axes would refuse).
        jitted = jax.jit(lambda key_data: mapped(self._on_mesh(key_data, P())))

        def call(key: Any) -> tuple[ShardedSample, dict]:
            key_data = _key_data(key, "ShardedTable.sampler")
            self._check_open("ShardedTable.sampler")
            return jitted(key_data)

        return call

    def updater(self) -> Callable[[ShardedSample, Any], jax.Array]:
        """A jitted function (ShardedSample, priorities) -> rows updated on each shard ([S], sharded).

        The sample is a sampler's of this table (B picks, either mode) and `priorities` one number per
        pick, in the sample's order: a numpy array or list, or a jax array of any placement (a sampler's
        sharding, one device, replicated), placed on the mesh with the picks' sharding (B / S on each
        device) before the update; an array already sharded so is taken as it is, without a copy. In a
        job of several processes a host value (numpy, a list, or a jax array on this process's devices
        only) is taken as the global array of B priorities and must be the same on every process.
        """

        def body(smp: ShardedSample, priorities: jax.Array) -> jax.Array:
            return update_priorities(self, smp, priorities)[None]

        row = P(self.axis)
        jitted: dict[int, Callable] = {}  # by window

        def placed(smp: ShardedSample, priorities: jax.Array) -> tuple[ShardedSample, jax.Array]:
            # The shard_map's in_specs: a mesh of Explicit axes refuses an argument of another sharding
            # (numpy, jnp.ones: unsharded) instead of moving it. A no-op where it is placed already.
            specs = ShardedSample(row, row, row, row, P(), window=smp.window)
            return jax.tree_util.tree_map(self._on_mesh, (smp, priorities), (specs, row))

        def call(smp: ShardedSample, priorities: Any) -> jax.Array:
            smp, priorities = self._updater_arguments(smp, priorities)
            self._check_open("ShardedTable.updater")
            if smp.window not in jitted:
                specs = (ShardedSample(row, row, row, row, P(), window=smp.window), row)
                mapped = jax.shard_map(body, mesh=self.mesh, in_specs=specs, out_specs=row, check_vma=False)
                jitted[smp.window] = jax.jit(lambda smp, priorities: mapped(*placed(smp, priorities)))
            smp, priorities = jax.tree_util.tree_map(self._off_other_devices, (smp, priorities))
            return jitted[smp.window](smp, priorities)

        return call

    def _on_mesh(self, x: Any, spec: P) -> jax.Array:
        """Inside the sampler's or updater's jit: `x` with the sharding NamedSharding(mesh, spec), as the
        shard_map's in_specs require on a mesh of Explicit axes (with Auto axes jit would move it)."""
        return jax.device_put(x, NamedSharding(self.mesh, spec))

    def _off_other_devices(self, x: Any) -> Any:
        """`x` where the updater's jit can take it: jit refuses an array committed to devices other than
        the mesh's (jax.device_put(x, device)), which then goes onto the mesh with the picks' sharding
        (or, in a job of several processes, where that array is this process's value, to the host: a host
        value is the global one, as for numpy). Anything else is taken as it is (placed inside the jit)."""
        if isinstance(x, jax.core.Tracer) or not isinstance(x, jax.Array) or not x.committed:
            return x
        if x.sharding.device_set == set(self.mesh.devices.flat):
            return x
        if jax.process_count() > 1 and x.is_fully_addressable:
            return np.asarray(x)
        return jax.device_put(x, NamedSharding(self.mesh, P(self.axis) if np.ndim(x) else P()))

    def _updater_arguments(self, smp: Any, priorities: Any) -> tuple[ShardedSample, Any]:
        """The updater's (sample, priorities), checked before the shard_map splits them: a sample of B
        picks, B a multiple of the shards, and one priority per pick (their dtype: update_priorities)."""
        op = "ShardedTable.updater"
        if not isinstance(smp, ShardedSample):
            raise InvalidArgumentError(
                f"{op}: the sample must be a gear_jax.sharded.ShardedSample (what a sampler of this table "
                f"returns), got {type(smp).__name__}"
            )
        shape = tuple(np.shape(smp.indices))
        if len(shape) != 1 or shape[0] % self.num_shards:
            raise InvalidArgumentError(
                f"{op}: the sample's indices have shape {shape}; the updater takes a sampler's sample, B "
                f"picks with B a multiple of the {self.num_shards} shards (for an epoch's picks use "
                "sharded.update_priorities or sharded.retire inside jax.shard_map)"
            )
        if not isinstance(priorities, jax.Array):
            priorities = np.asarray(priorities)  # lists and numpy: one array, of their dtype
        if tuple(priorities.shape) != shape:
            raise InvalidArgumentError(
                f"{op}: priorities has shape {tuple(priorities.shape)}, the sample has {shape} picks: pass "
                "one priority per pick, in the sample's order"
            )
        return smp, priorities


def _key_data(key: Any, op: str) -> Any:
    """Raw key data (uint32, the default PRNG implementation's shape) as a host array, the same on every
    process, from a typed key, raw key data or an int seed; a traced key stays traced."""
    expected = jax.random.key_data(jax.random.key(0))
    problem = (
        f"{op}: key must be a JAX PRNG key (jax.random.key(seed)), its raw key data (uint32 of shape "
        f"{expected.shape}, as jax.random.key_data gives it) or an int seed, the same on every process"
    )
    if isinstance(key, (bool, np.bool_)):
        raise InvalidArgumentError(f"{problem}; got {key!r}")
    if isinstance(key, (int, np.integer)):
        try:
            key = jax.random.key(int(key))
        except (OverflowError, TypeError, ValueError) as e:
            raise InvalidArgumentError(f"{problem}; the seed {key} does not fit ({e})") from None
    dtype = getattr(key, "dtype", None)
    if dtype is not None and jnp.issubdtype(dtype, jax.dtypes.prng_key):
        if jnp.shape(key) != ():
            raise InvalidArgumentError(f"{problem}; got an array of {jnp.shape(key)} keys: pass one")
        key = jax.random.key_data(key)
    elif not isinstance(key, (jax.Array, np.ndarray, list, tuple)):
        raise InvalidArgumentError(f"{problem}; got {type(key).__name__}")
    data = key if isinstance(key, jax.core.Tracer) else np.asarray(key)
    if data.dtype != expected.dtype or data.shape != expected.shape:
        raise InvalidArgumentError(f"{problem}; got {data.dtype} of shape {data.shape}")
    return data


def mesh_devices(spec: TableSpec | None, mesh: Mesh, axis: str, op: str) -> list[Any]:
    """The devices along `axis` of `mesh`, one shard each, after checking the arguments of `op` (`spec`
    too, unless None)."""
    if spec is not None and not isinstance(spec, TableSpec):
        raise InvalidArgumentError(f"{op}: spec must be a gear_jax.TableSpec, got {type(spec).__name__}")
    if not isinstance(mesh, Mesh):
        raise InvalidArgumentError(f"{op}: mesh must be a jax.sharding.Mesh, got {type(mesh).__name__}")
    if axis not in mesh.axis_names:
        raise InvalidArgumentError(
            f"{op}: axis={axis!r} is not an axis of the mesh (its axes: {tuple(mesh.axis_names)}); pass "
            "axis= one of them or build the mesh with that axis"
        )
    others = {n: mesh.shape[n] for n in mesh.axis_names if n != axis and mesh.shape[n] != 1}
    if others:
        raise InvalidArgumentError(
            f"{op}: the mesh's other axes {others} have more than one device; a sharded table needs one "
            f"shard per device, so its mesh must vary only along {axis!r}"
        )
    devices = list(np.moveaxis(mesh.devices, list(mesh.axis_names).index(axis), 0).reshape(-1))
    if spec is not None and len(devices) * spec.capacity > MAX_GLOBAL_ROWS:
        raise InvalidArgumentError(
            f"{op}: {len(devices)} shards x capacity {spec.capacity} rows exceed the int32 global row ids "
            f"({MAX_GLOBAL_ROWS}); use fewer rows per shard"
        )
    return devices


def agreed_name(spec: TableSpec | None, name: str | None, error: BaseException | None, op: str) -> str:
    """The name every process uses: `name`, or the one process 0 draws when it is None. Then every
    process reports `error` (its arguments' check) and the digest of its spec and name: any error, or
    any spec or name that differs from process 0's, raises on every process."""
    from jax.experimental import multihost_utils

    drawn = np.frombuffer(secrets.token_bytes(16), np.uint8)  # every process joins the broadcast
    drawn = np.asarray(multihost_utils.broadcast_one_to_all(drawn))
    if name is None:
        name = "gear_jax_sharded_" + bytes(drawn.astype(np.uint8)).hex()
    text = ("" if spec is None else spec.to_json()) + "\0" + str(name)
    mine = np.frombuffer(hashlib.sha256(text.encode()).digest()[:16], np.uint8)
    every = _agreement.agree(error, op, payload=mine)
    differing = [p for p in range(every.shape[0]) if not np.array_equal(every[p], every[0])]
    if differing:
        raise InvalidArgumentError(
            f"{op}: the spec or name differ across processes (processes {differing} differ from process 0): "
            "every process must pass the same TableSpec and name"
        )
    return name


def _check(table: Any, op: str) -> ShardedTable:
    """`table` when it is a ShardedTable and the call runs inside `jax.shard_map` over its axis, with one
    device per shard."""
    if not isinstance(table, ShardedTable):
        raise InvalidArgumentError(f"{op}: table must be a gear_jax.ShardedTable, got {type(table).__name__}")
    try:
        size = lax.axis_size(table.axis)
    except NameError:
        raise InvalidArgumentError(
            f"{op} runs on every device at once: call it inside jax.shard_map over the axis {table.axis!r} "
            "of the table's mesh (jax.shard_map(step, mesh=table.mesh, ...)), or use "
            "ShardedTable.sampler / ShardedTable.updater, which build that shard_map"
        ) from None
    if size != table.num_shards:
        raise InvalidArgumentError(
            f"{op}: the shard_map's axis {table.axis!r} has {size} devices, the table {table.num_shards} "
            "shards; map over the table's own mesh (mesh=table.mesh)"
        )
    return table


def sample(
    table: ShardedTable,
    key: jax.Array,
    batch_size: int,
    method: str = "uniform",
    mode: str = "global",
    priority_exponent: float = 1.0,
    window: int | None = None,
    fields: Sequence[str] | None = None,
    after: Any = None,
    short_episodes: str = "pad",
    capacity_factor: float | None = CAPACITY_FACTOR,
) -> tuple[ShardedSample, dict[str, jax.Array]]:
    """Inside `jax.shard_map` over `table.axis`: B picks over every shard, and this device's B / S of
    them with their rows.

    Args:
      table: a `ShardedTable` (static).
      key: a PRNG key, the same on every device (do not fold in the device index).
      batch_size: B picks in all (static); a multiple of the number of shards S.
      method: "uniform", "prioritized", "fifo", "lifo" or "topk".
      mode: "global" (the law, or the answer, of one table holding every shard's rows; see the module
        docstring for fifo's order across shards) or "local" (each device draws its B / S picks from
        its own shard).
      priority_exponent: a >= 0 for "prioritized".
      window: for trajectory tables, steps per window; None for whole rows.
      fields: fields to gather; default all.
      after: an array this sample must run after (e.g. `update_priorities`' result).
      short_episodes: as for `gear_jax.sample`. In global mode, uniform windows of step rings and
        uniform windows with "skip" follow the law of one table holding every shard's rows (the
        module's docstring says how).
      capacity_factor: global mode: the first capacity of the exchange's blocks, as a multiple of their
        mean B / S^2 (`exchange_capacities`; static); None: full-size blocks, S x B / S rows sent per
        device. Any value gives the same picks and rows; it sets the bytes moved.

    Returns:
      (ShardedSample, batch): the batch holds [B / S, ...] per field (or [B / S, window, ...]) and
      `valid`.

    Raises:
      InvalidArgumentError: bad batch size, method, mode or window, or a call outside shard_map (at
        trace time); for fifo, lifo and topk, a batch_size no table could fill: more than the S x
        capacity rows of every shard (global) or B / S more than one shard's capacity (local).
      gear_jax.EXECUTION_ERRORS: at run time, when every shard is empty (global) or this device's
        shard is (local); for fifo, lifo and topk, when the shards together hold fewer than B selectable
        rows (global: every shard's table raises the single-table error) or this device's shard holds
        fewer than B / S (local).
    """
    st = _check(table, "sharded.sample")
    _args.check_method(method, "sharded.sample", SHARDED_METHODS)
    if mode not in MODES:
        raise InvalidArgumentError(f"sharded.sample: mode={mode!r} is not one of {MODES}")
    if mode == "global" and method in ORDERED_METHODS and st.max_times_sampled is not None:
        raise InvalidArgumentError(
            f"sharded.sample: method={method!r} in global mode takes candidates on every shard that the "
            "exchange may not deliver, which a table with max_times_sampled would count as samples; use "
            'mode="local", or uniform or prioritized'
        )
    num_shards = st.num_shards
    batch_size = _args.check_batch_size(batch_size, "sharded.sample")
    if batch_size % num_shards:
        raise InvalidArgumentError(
            f"sharded.sample: batch_size={batch_size!r} must be a positive multiple of the {num_shards} "
            f"shards (each device consumes batch_size / {num_shards} picks)"
        )
    if method in ORDERED_METHODS:  # distinct rows: at most what the shards (local: one shard) can hold
        most = st.capacity * (num_shards if mode == "global" else 1)
        if batch_size // (1 if mode == "global" else num_shards) > most:
            where = (
                f"the {num_shards} shards' {most} rows in all (capacity {st.capacity} each)"
                if mode == "global"
                else f"one shard's capacity ({most}): each device takes batch_size / {num_shards} "
                "distinct rows of its own shard"
            )
            raise InvalidArgumentError(
                f"sharded.sample: batch_size={batch_size} in {mode} mode exceeds {where}; {method} picks "
                "distinct rows: lower batch_size"
            )
    win = _args.check_window(window, st.spec.max_steps, "sharded.sample")
    _args.method_word(st.spec, method, win, short_episodes, "sharded.sample")  # its checks
    given_exponent = _args.check_exponent(priority_exponent, "sharded.sample")
    _args.check_options_take_effect(method, given_exponent, win, short_episodes, "sharded.sample")
    capacity_factor = _args.check_capacity_factor(capacity_factor, "sharded.sample")
    # Uniform windows whose law weighs rows by their windows (step rings) or skips the short ones: the
    # shards are weighed under that law and draw their own picks by it (the module's docstring).
    window_law = (
        mode == "global"
        and method == "uniform"
        and win > 0
        and (st.spec.step_ring or short_episodes == "skip")
    )
    exponent = 0.0 if method == "uniform" else given_exponent
    per_device = int(batch_size) // num_shards
    me = lax.axis_index(st.axis)
    select_key, window_key = jax.random.split(key)
    # The shard totals matter only to global uniform and prioritized sampling; the rest need the count
    # alone, which exponent 0 gives without a power per row.
    needs_total = mode == "global" and method in ("uniform", "prioritized")
    total, count = st._on_my_shard(
        lambda t: ops.total_weight(
            t,
            exponent if needs_total else 0.0,
            after=after,
            window=window if window_law else None,
            short_episodes=short_episodes,
        )
    )
    if needs_total:
        # Every shard's total and count in one all_gather (a collective costs milliseconds between
        # processes): the totals weigh the shards, the counts sum to psum's count.
        totals, counts = _all_gather_words([total.astype(jnp.float32), count.astype(jnp.int32)], st.axis)
        selectable = jnp.sum(counts)
    else:
        totals, selectable = None, lax.psum(count, st.axis)

    if mode == "local":
        shard_key = jax.random.fold_in(select_key, me)
        smp = st._on_my_shard(
            lambda t: ops.sample(
                t,
                shard_key,
                per_device,
                method=method,
                priority_exponent=exponent if method == "prioritized" else 1.0,
                window=window,
                after=after,
                short_episodes=short_episodes,
            )
        )
        batch = st._on_my_shard(lambda t: ops.gather(t, smp, fields))
        result = ShardedSample(
            me * st.capacity + smp.indices,
            smp.generations,
            smp.probabilities if method in ORDERED_METHODS else smp.probabilities / num_shards,
            smp.starts,
            selectable,
            window=win,
        )
        return result, batch

    if method in ORDERED_METHODS:
        owner, smp = _merge_ordered(st, window_key, int(batch_size), method, window, selectable, after)
    elif window_law:
        owner, smp = _draw_by_window_law(
            st, select_key, window_key, int(batch_size), totals, win, short_episodes, after
        )
    else:
        owner, smp = _draw_global(
            st, select_key, window_key, int(batch_size), exponent, totals, method, window, after
        )
    # Pick j is consumed by device j // per_device; its owner gathers it and sends it there.
    my_owners = lax.dynamic_slice(owner, (me * per_device,), (per_device,))
    capacities = exchange_capacities(int(batch_size), num_shards, capacity_factor)
    moved = _exchange(st, owner, my_owners, smp, fields, capacities)
    result = ShardedSample(
        my_owners * st.capacity + moved["indices"],
        moved["generations"],
        moved["probabilities"],
        moved["starts"],
        selectable,
        window=win,
    )
    return result, {name[len("field:") :]: v for name, v in moved.items() if name.startswith("field:")}


def exchange_capacities(batch_size: int, num_shards: int, capacity_factor: float | None) -> tuple[int, ...]:
    """The picks each (source shard, consumer) block of global mode's exchange holds, one capacity per
    compiled branch, smallest first; a step takes the first that holds its fullest block (every device
    takes the same: the picks' owners are the same everywhere). The last is B / S, which always fits;
    `capacity_factor` None gives that one alone (every block full size, S x B / S rows per device).

    A block's count is binomial(B / S, share of its source shard) given the shards' totals: with equal
    shares its mean is B / S^2, and the first capacity, ceil(capacity_factor x B / S^2) + EXCHANGE_SLACK,
    lies several standard deviations above it (at S = 4, B = 1024: mean 64, sd 6.9, capacity 100, 5.2
    sd). Unequal shares (a shard still filling, skewed priorities) take a later branch."""
    per_device = batch_size // num_shards
    if capacity_factor is None:
        return (per_device,)
    first = min(per_device, math.ceil(capacity_factor * batch_size / num_shards**2) + EXCHANGE_SLACK)
    growth = max(1.5, (per_device / first) ** (1 / (EXCHANGE_BRANCHES - 1)))
    capacities = [first]
    while capacities[-1] < per_device and len(capacities) < EXCHANGE_BRANCHES - 1:
        capacities.append(min(per_device, math.ceil(capacities[-1] * growth)))
    if capacities[-1] < per_device:
        capacities.append(per_device)
    return tuple(capacities)


def exchange_branch(owner: Any, num_shards: int, capacities: tuple[int, ...]) -> Any:
    """The branch (an index into `capacities`) a step whose B picks have owners `owner` takes: the first
    capacity that holds the fullest (source, consumer) block. numpy in, numpy out (the benchmarks count
    the bytes a step sent); jax in, jax out (the step itself)."""
    xp = np if isinstance(owner, np.ndarray) else jnp
    per_device = owner.shape[0] // num_shards
    # blocks[s, d]: the picks shard s owns among consumer d's
    blocks = (owner.reshape((num_shards, per_device))[:, :, None] == xp.arange(num_shards)).sum(axis=1).T
    branch = xp.searchsorted(xp.asarray(capacities), blocks.max(), side="left")
    return xp.minimum(branch, len(capacities) - 1)


def _exchange(
    st: ShardedTable,
    owner: jax.Array,
    my_owners: jax.Array,
    smp: Sample,
    fields: Sequence[str] | None,
    capacities: tuple[int, ...],
) -> dict[str, jax.Array]:
    """Gathers this shard's picks and moves every pick to its consumer (pick j to device j //
    per_device; `my_owners` holds the owners of this consumer's picks): the consumer's per_device picks
    of `indices`, `generations`, `probabilities`, `starts` and each gathered field as `field:<name>`.
    `smp` is this shard's Sample of the B slots (the failed-pick marker where another shard owns the
    pick). Each shard packs the picks it owns for each consumer into a block of C slots (C from
    `capacities`, the branch every device agrees on), gathers those S x C rows only, and one all_to_all
    moves the blocks; the consumer takes pick j from block owner[j] at its rank among that owner's picks
    of the consumer's."""
    num_shards = st.num_shards
    me = lax.axis_index(st.axis)
    batch_size, per_device = owner.shape[0], my_owners.shape[0]
    consumer = jnp.arange(batch_size) // per_device
    # Each pick's rank among the picks of its (owner, consumer) block, in pick order: the same everywhere.
    owned_by = (owner[:, None] == jnp.arange(num_shards)[None, :]).astype(jnp.int32)  # [B, S]
    ranks_by_owner = jnp.cumsum(owned_by.reshape((num_shards, per_device, num_shards)), axis=1) - 1
    rank = jnp.take_along_axis(ranks_by_owner.reshape((batch_size, num_shards)), owner[:, None], axis=1)[:, 0]
    my_ranks = lax.dynamic_slice(rank, (me * per_device,), (per_device,))

    def exchange(capacity: int) -> dict[str, jax.Array]:
        slots = num_shards * capacity
        # The picks this shard sends, block by block: slot d * C + r holds its r-th pick for consumer d.
        slot = jnp.where((owner == me) & (rank < capacity), consumer * capacity + rank, slots)
        sent = (
            jnp.full((slots,), -1, jnp.int32)
            .at[slot]
            .set(jnp.arange(batch_size, dtype=jnp.int32), mode="drop")
        )
        used = sent >= 0
        pick = jnp.maximum(sent, 0)
        compact = dataclasses.replace(
            smp,
            indices=jnp.where(used, smp.indices[pick], 0),
            generations=jnp.where(used, smp.generations[pick], jnp.uint32(1)),  # unused: the marker
            probabilities=jnp.where(used, smp.probabilities[pick], 0.0).astype(jnp.float32),
            starts=jnp.where(used, smp.starts[pick], 0),
        )
        rows = st._on_my_shard(lambda t: ops.gather(t, compact, fields))
        routed = {
            "indices": compact.indices,
            "generations": compact.generations,
            "probabilities": compact.probabilities,
            "starts": compact.starts,
            **{f"field:{name}": value for name, value in rows.items()},
        }
        return _route(routed, my_owners, my_ranks, st.axis, num_shards, capacity)

    if len(capacities) == 1:
        return exchange(capacities[0])
    branch = exchange_branch(owner, num_shards, capacities)
    return lax.switch(branch, [functools.partial(exchange, c) for c in capacities])


def _route(
    arrays: dict[str, jax.Array],
    my_owners: jax.Array,
    my_ranks: jax.Array,
    axis: str,
    num_shards: int,
    capacity: int,
) -> dict[str, jax.Array]:
    """Moves the blocks of every array (leading axis S x capacity: block d for consumer d) to their
    consumers, and takes this consumer's pick k from block my_owners[k] at slot my_ranks[k]: every
    array's bytes packed into one uint8 [S x capacity, bytes] buffer, so that one all_to_all moves them
    all (a collective costs milliseconds between processes)."""
    per_device = my_owners.shape[0]
    columns, layout = [], []
    for name, x in arrays.items():
        flat = x.reshape((x.shape[0], -1))
        if x.dtype == jnp.bool_:
            raw = flat.astype(jnp.uint8)
        elif x.dtype.itemsize == 1:
            raw = lax.bitcast_convert_type(flat, jnp.uint8)
        else:
            raw = lax.bitcast_convert_type(flat, jnp.uint8).reshape((x.shape[0], -1))
        columns.append(raw)
        layout.append((name, x.shape[1:], x.dtype, raw.shape[1]))
    packed = jnp.concatenate(columns, axis=1)
    blocks = lax.all_to_all(packed.reshape((num_shards, capacity, packed.shape[1])), axis, 0, 0)
    mine = blocks[my_owners, jnp.clip(my_ranks, 0, capacity - 1)]  # [per_device, bytes]
    out, offset = {}, 0
    for name, shape, dtype, width in layout:
        raw = mine[:, offset : offset + width]
        offset += width
        if dtype == jnp.bool_:
            value = raw != 0
        elif dtype.itemsize == 1:
            value = lax.bitcast_convert_type(raw, dtype)
        else:
            value = lax.bitcast_convert_type(raw.reshape((per_device, -1, dtype.itemsize)), dtype)
        out[name] = value.reshape((per_device,) + shape)
    return out


def _all_gather_words(arrays: Sequence[jax.Array], axis: str, tiled: bool = False) -> list[jax.Array]:
    """Arrays of one shape and 32-bit dtypes, each as `lax.all_gather(x, axis, tiled=tiled)` returns it,
    moved by one all_gather of their words (a collective costs milliseconds between processes)."""
    words = jnp.stack([lax.bitcast_convert_type(x, jnp.int32) for x in arrays], axis=-1)
    every = lax.all_gather(words, axis, tiled=tiled)
    return [lax.bitcast_convert_type(every[..., i], x.dtype) for i, x in enumerate(arrays)]


def _owners(
    st: ShardedTable, select_key: jax.Array, batch_size: int, totals: jax.Array
) -> tuple[jax.Array, ...]:
    """(owner shard of each of the B picks, drawn in proportion to the shards' `totals` ([S], the same on
    every device); this shard's cumulative start; the whole; each pick's target in [0, whole)), the
    same on every device."""
    num_shards = st.num_shards
    bounds = jnp.cumsum(totals)  # inclusive; computed identically everywhere
    whole = bounds[-1]
    starts_of_shards = jnp.concatenate([jnp.zeros((1,), bounds.dtype), bounds[:-1]])
    u = jax.random.uniform(select_key, (batch_size,), jnp.float32)
    targets = jnp.minimum(u * whole, jnp.nextafter(whole, jnp.float32(0)))
    owner = jnp.clip(jnp.searchsorted(bounds, targets, side="right"), 0, num_shards - 1).astype(jnp.int32)
    return owner, starts_of_shards[lax.axis_index(st.axis)], whole, targets


def _draw_by_window_law(
    st: ShardedTable,
    select_key: jax.Array,
    window_key: jax.Array,
    batch_size: int,
    totals: jax.Array,
    window: int,
    short_episodes: str,
    after: Any,
) -> tuple[jax.Array, Sample]:
    """Global uniform windows under a law that weighs rows by their windows (`totals` are the shards'
    `total_weight(..., window=W)`): each pick's owner drawn by the shards' totals, then each shard's
    `sample` of B picks by the one-table law, its k-th owned pick taking the k-th. (owner of each of
    the B picks, this shard's Sample of B slots, the failed-pick marker where another shard owns the
    pick.) Probabilities are the shard's sample probabilities times its share of the whole."""
    me = lax.axis_index(st.axis)
    total = totals[me]
    owner, _, whole, _ = _owners(st, select_key, batch_size, totals)
    mine = (owner == me) & (whole > 0)
    rank = jnp.clip(jnp.cumsum(mine.astype(jnp.int32)) - 1, 0, batch_size - 1)

    def draw(t: Table) -> tuple[jax.Array, ...]:
        smp = ops.sample(
            t,
            jax.random.fold_in(window_key, me),
            batch_size,
            window=window,
            after=after,
            short_episodes=short_episodes,
        )
        return smp.indices, smp.generations, smp.probabilities, smp.starts

    def owns_none(t: Table) -> tuple[jax.Array, ...]:  # a shard of total 0 owns no pick
        zeros = jnp.zeros((batch_size,), jnp.int32)
        return zeros, jnp.ones((batch_size,), jnp.uint32), jnp.zeros((batch_size,), jnp.float32), zeros

    branch = jnp.where(whole > 0, jnp.where(total > 0, 1, 0), 1)  # every shard empty: the table's error
    indices, generations, probabilities, starts = lax.switch(
        branch, [lambda: st._on_my_shard(owns_none), lambda: st._on_my_shard(draw)]
    )
    scale = total / jnp.where(whole > 0, whole, 1)
    smp = Sample(
        jnp.where(mine, indices[rank], 0),
        jnp.where(mine, generations[rank], jnp.uint32(1)),
        jnp.where(mine, probabilities[rank] * scale, 0.0).astype(jnp.float32),
        jnp.where(mine, starts[rank], 0),
        window=window,
        table_handle=None,
    )
    return owner, smp


def _draw_global(
    st: ShardedTable,
    select_key: jax.Array,
    window_key: jax.Array,
    batch_size: int,
    exponent: float,
    totals: jax.Array,
    method: str,
    window: int | None,
    after: Any,
) -> tuple[jax.Array, Sample]:
    """Uniform and prioritized picks over every shard: (owner shard of each of the B picks, this
    shard's Sample of B slots, the failed-pick marker where another shard owns the pick). Probabilities
    are p_i^a / W over every shard."""
    me = lax.axis_index(st.axis)
    total = totals[me]
    owner, my_start, whole, targets = _owners(st, select_key, batch_size, totals)
    mine = (owner == me) & (whole > 0)
    local_targets = jnp.where(mine, jnp.maximum(targets - my_start, 0.0), -1.0)

    def draw(t: Table) -> Sample:
        return ops.sample_at(
            t, window_key, local_targets, priority_exponent=exponent, window=window, after=after
        )

    def every_shard_empty(t: Table) -> Sample:
        # Raises at run time with the single-table error: no shard holds a selectable row.
        smp = ops.sample(
            t,
            window_key,
            batch_size,
            method=method,
            priority_exponent=exponent if method == "prioritized" else 1.0,
            window=window,
            after=after,
        )
        return dataclasses.replace(smp, selectable=None, lengths=None)

    smp = lax.cond(whole > 0, lambda: st._on_my_shard(draw), lambda: st._on_my_shard(every_shard_empty))
    scale = total / jnp.where(whole > 0, whole, 1)
    return owner, dataclasses.replace(smp, probabilities=smp.probabilities * scale)


def _merge_ordered(
    st: ShardedTable,
    window_key: jax.Array,
    batch_size: int,
    method: str,
    window: int | None,
    selectable: jax.Array,
    after: Any,
) -> tuple[jax.Array, Sample]:
    """fifo, lifo and topk over every shard, decentralized: each shard's K = min(B, capacity) best rows
    are its candidates (no shard offers more than its capacity, and B <= S x capacity: `sample` checks
    it); their order keys (8 bytes each) are all-gathered, and every device sorts the S x K keys the same
    way and keeps the B best. (owner shard of each pick, this shard's Sample of K slots as in
    _draw_global; probabilities 1.)

    The answer is the one-table answer for a table holding every shard's rows: topk by priority, ties to
    the lower global row id; fifo by each shard's commit order with ties to the lower shard (the k-th row
    committed to any shard comes before the (k+1)-th of any shard), lifo the reverse of fifo.
    """
    num_shards = st.num_shards
    me = lax.axis_index(st.axis)
    per_shard = min(batch_size, st.capacity)

    def candidates(t: Table) -> tuple[Sample, jax.Array]:
        return ops.ordered_candidates(t, window_key, per_shard, method, window=window, after=after)

    def too_few(t: Table) -> tuple[Sample, jax.Array]:
        # The shards together hold fewer than B selectable rows: every shard raises the single-table
        # error at run time (each holds fewer than B), so that no device goes on to wait in the
        # all_gather below for one that failed. A B above the shard's capacity, which one table can never
        # fill, must not be refused at trace time: the shards together may fill it (the other branch).
        smp = ops.sample(
            t, window_key, batch_size, method=method, window=window, after=after, defer_capacity_check=True
        )
        smp = dataclasses.replace(smp, selectable=None, lengths=None)
        head = jax.tree_util.tree_map(lambda x: x[:per_shard], smp)  # the candidates' shapes
        return head, jnp.full((per_shard, 2), 0xFFFFFFFF, jnp.uint32)

    local, keys = lax.cond(
        selectable >= batch_size, lambda: st._on_my_shard(candidates), lambda: st._on_my_shard(too_few)
    )
    every = lax.all_gather(keys, st.axis)  # [S, K, 2]: low and high words, the same on every device
    low, high = every[..., 0].reshape(-1), every[..., 1].reshape(-1)
    shard = jnp.repeat(jnp.arange(num_shards, dtype=jnp.uint32), per_shard)
    if method == "topk":  # (priority descending, shard, row): the global row id breaks ties
        order = jnp.lexsort((low, shard, high))
    elif method == "fifo":  # (commit order, shard)
        order = jnp.lexsort((shard, low, high))
    else:  # lifo: the reverse of fifo
        order = jnp.lexsort((jnp.uint32(num_shards - 1) - shard, low, high))
    winners = order[:batch_size]
    owner = (winners // per_shard).astype(jnp.int32)
    slot = winners % per_shard
    mine = owner == me
    smp = Sample(
        jnp.where(mine, local.indices[slot], 0),
        jnp.where(mine, local.generations[slot], jnp.uint32(1)),
        jnp.where(mine, local.probabilities[slot], 0.0),
        jnp.where(mine, local.starts[slot], 0),
        window=local.window,
    )
    return owner, smp


def update_priorities(
    table: ShardedTable, sample: ShardedSample, priorities: jax.Array, after: Any = None
) -> jax.Array:
    """Inside `jax.shard_map` over `table.axis`: each device's B / S priorities reach the shards that
    own the rows. Stale updates (rows overwritten since the sample) are ignored, as on one table.

    Returns the number of rows this device's shard updated (int32 scalar); pass it as `after=` to the
    next `sample` to order the two.

    Raises:
      InvalidArgumentError: called outside shard_map, a sample that is not a ShardedSample, or priorities
        of another shape than this device's picks or of a dtype other than float or int (at trace time).
      gear_jax.EXECUTION_ERRORS: at run time, on every device and with no row changed, for a global row
        id outside [0, S x capacity) (each shard's update refuses it as an index outside its rows) or a
        priority that is NaN, infinite or negative; or a table closed since the function was traced.
    """
    op = "sharded.update_priorities"
    st = _check(table, op)
    if not isinstance(sample, ShardedSample):
        raise InvalidArgumentError(f"{op}: sample must be a ShardedSample, got {type(sample).__name__}")
    shape = jnp.shape(sample.indices)
    if len(shape) != 1:
        raise InvalidArgumentError(
            f"{op}: the sample's indices have shape {shape}, expected (b,): this device's picks (flatten "
            "an epoch's [M, b] picks first, as sharded.retire does)"
        )
    for name in ("indices", "generations"):  # a cast to 32 bits must not name another row
        dtype = np.dtype(jnp.result_type(getattr(sample, name)))
        if not jnp.issubdtype(dtype, jnp.integer) or dtype.itemsize > 4:
            raise InvalidArgumentError(
                f"{op}: the sample's {name} have dtype {dtype}; they must be integers of at most 32 bits "
                "(a ShardedSample holds int32 global row ids and uint32 generations)"
            )
    # Their dtype and shape as the one-table update checks them (bools refused, say).
    priorities = _rows.traced_priorities(
        priorities, shape[0], op, "priorities", broadcast=False, matched="the sample's picks on this device"
    )
    me = lax.axis_index(st.axis)
    indices, generations, values = _all_gather_words(
        [sample.indices.astype(jnp.int32), sample.generations.astype(jnp.uint32), priorities],
        st.axis,
        tiled=True,
    )
    # A global row id outside [0, S x capacity) goes, as it is, to every shard, whose update refuses it as
    # one table refuses an index outside its rows: the call fails on every device (none is left waiting in
    # a later collective) and no shard changes a row. Every shard also takes every priority (its checks
    # refuse a bad one wherever its row lies); the picks of other shards carry the odd generation 1,
    # which is never applied.
    in_range = (indices >= 0) & (indices < st.num_shards * st.capacity)
    mine = in_range & (indices // st.capacity == me)
    local = Sample(
        jnp.where(mine, indices % st.capacity, jnp.where(in_range, 0, indices)).astype(jnp.int32),
        jnp.where(mine, generations, jnp.uint32(1)),  # odd: never applied
        jnp.zeros(indices.shape, jnp.float32),
        jnp.zeros(indices.shape, jnp.int32),
        window=sample.window,
    )
    return st._on_my_shard(lambda t: ops.update_priorities(t, local, values, after=after))


def epoch(
    table: ShardedTable,
    key: jax.Array,
    minibatch_size: int,
    num_rows: int | None = None,
    drop_last: bool = True,
    window: int | None = None,
    fields: Sequence[str] | None = None,
    after: Any = None,
) -> tuple[ShardedSample, dict[str, jax.Array]]:
    """Inside `jax.shard_map` over `table.axis`: one epoch over this device's own shard (local mode), as
    `gear_jax.epoch` over that shard's table, with its rows gathered; no row moves between devices.

    Args:
      table: a `ShardedTable` (static).
      key: a PRNG key, the same on every device (each folds in its own index).
      minibatch_size: as for `gear_jax.epoch`.
      num_rows: as for `gear_jax.epoch`, per shard (default a shard's capacity).
      drop_last: as for `gear_jax.epoch`.
      window: as for `gear_jax.epoch`.
      after: as for `gear_jax.epoch`.
      fields: fields to gather; default all.

    Returns:
      (ShardedSample, batch): [M, minibatch_size] picks with global row ids (`selectable`: the global
      count N of selectable rows, replicated, as `sample` gives it) and [M, minibatch_size, ...] per
      field plus `valid`.
    """
    from gear_jax import epochs

    st = _check(table, "sharded.epoch")
    _args.seed_words(key, "sharded.epoch")  # a bad key refused by name
    me = lax.axis_index(st.axis)
    shard_key = jax.random.fold_in(key, me)
    picks = st._on_my_shard(
        lambda t: epochs.epoch(t, shard_key, minibatch_size, num_rows, drop_last, window, after)
    )
    flat = jax.tree_util.tree_map(jnp.ravel, picks)
    batch = st._on_my_shard(lambda t: ops.gather(t, flat, fields))
    shape = picks.indices.shape
    batch = {name: v.reshape(*shape, *v.shape[1:]) for name, v in batch.items()}
    _, count = st._on_my_shard(lambda t: ops.total_weight(t, 0.0, after=after))
    result = ShardedSample(
        me * st.capacity + picks.indices,
        picks.generations,
        picks.probabilities,
        picks.starts,
        lax.psum(count, st.axis),
        window=picks.window,
    )
    return result, batch


def retire(table: ShardedTable, sample: ShardedSample, after: Any = None) -> jax.Array:
    """Inside `jax.shard_map`: makes the rows of `sample` (any shape, e.g. an epoch's) unselectable,
    priority 0, where they still hold what was picked, on the shards that own them; returns the count
    this device's shard retired."""
    _check(table, "sharded.retire")
    if not isinstance(sample, ShardedSample):
        raise InvalidArgumentError(
            f"sharded.retire: sample must be a ShardedSample (an epoch's), got {type(sample).__name__}"
        )
    flat = jax.tree_util.tree_map(jnp.ravel, sample)
    return update_priorities(table, flat, jnp.zeros(flat.indices.shape, jnp.float32), after=after)


def importance_weights(table: ShardedTable, sample: ShardedSample, beta: float) -> jax.Array:
    """Inside `jax.shard_map`: (N * P)^-beta for this device's picks, divided by the maximum over the
    global batch (a `pmax`); 0 for a pick that holds no row. `beta` may be traced (annealed in the
    jitted step)."""
    st = _check(table, "sharded.importance_weights")
    if not isinstance(sample, ShardedSample):
        raise InvalidArgumentError(
            "sharded.importance_weights: sample must be a ShardedSample (what sharded.sample returns), got "
            f"{type(sample).__name__}"
        )
    n = sample.selectable.astype(jnp.float32)
    held = sample.probabilities > 0
    raw = jnp.where(
        held, (n * jnp.where(held, sample.probabilities, 1.0)) ** -jnp.asarray(beta, jnp.float32), 0.0
    )
    return raw / jnp.maximum(lax.pmax(jnp.max(raw), st.axis), jnp.finfo(jnp.float32).tiny)
