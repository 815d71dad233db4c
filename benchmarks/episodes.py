"""The `episodes` suite: variable-length episodes, host memory per stored step and window sample + gather.

Every system holds the same episodes (`EpisodeData`: lengths drawn from `--lengths`, filled up to a
budget of `--steps` steps of `--step_bytes` bytes each) and reports two things at each point:

  * memory: what holding the episodes costs, as bytes per stored step and as a ratio to the steps' own
    bytes (`memory` in every record; `measured_as` says how each system's bytes were counted);
  * speed: one step of B windows of W steps (`--batch_size`, `--window`, default 32), sampled and
    gathered (op `sample_gather`), timed as the other suites do.

Systems: `gear_jax`, the step-ring trajectory table (steps of every episode back to back in one ring,
an index of episodes; windows uniform over every valid start, episodes shorter than the window
skipped); `gear_jax_padded`, today's padded trajectory table (one row of `max_steps` steps per
episode; windows uniform in a uniformly picked row, short episodes padded); `gear_jax_padded_skip`,
the padded table sampled with `short_episodes="skip"` as the ring is (with `--interleave` it samples
the table of `gear_jax_padded`: no second copy), so that the ring is also timed against the padded
table doing the same work per call (`LIKE_FOR_LIKE`); flashbax's trajectory
buffer; torchrl's `ReplayBuffer(LazyTensorStorage, SliceSampler)`; Reverb (`--reverb_python`: a server
in another interpreter, one item per window start referencing chunks of steps stored once). A system
this build or machine lacks is skipped with a note.
"""

from __future__ import annotations

import argparse
import functools
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from rich.table import Table as RichTable

import gear_jax as gj
from gear_jax.bench.common import GEAR, Unavailable, parse_ints, parse_names
from gear_jax.bench.data import CHUNK_BYTES, POOL_ROWS
from gear_jax.bench.display import console, progress
from gear_jax.bench.reverb_baseline import run_worker
from gear_jax.bench.selection import measure
from gear_jax.bench.systems import Step, System, import_torchrl

DEFAULTS = {"lengths": "cartpole,lognormal", "steps": "1000000", "step_bytes": "1024", "batch_size": "256"}
PLOT = {"x": "batch_size", "y": "bytes_per_s", "label": "GB/s of windows gathered"}
PADDED = "gear_jax_padded"
PADDED_SKIP = "gear_jax_padded_skip"
SYSTEMS = (GEAR, PADDED, PADDED_SKIP, "flashbax", "torchrl", "reverb")
# The step ring against the padded table doing the same work per call: both with short_episodes="skip",
# every window W steps of one episode, the same bytes copied (the laws differ only in how they weigh
# the episodes: every valid start equally likely in the ring, a row then a start in the padded table).
# Against the padded table's default ("pad") the work differs: it picks short episodes (rows uniform)
# and zeroes the padding of their windows (9-10% of the steps of this suite's windows) where the ring
# copies steps. Under "pad" the two laws still differ in what they pad: the ring weighs a short episode
# as one window against a long one's many, so its windows are almost all whole.
LIKE_FOR_LIKE = {GEAR: PADDED_SKIP}
OP = "sample_gather"
DEFAULT_WINDOW = 32
LENGTH_KINDS = ("cartpole", "lognormal")
CARTPOLE_ENV = "CartPole-v1"
CARTPOLE_LEAN_GAIN = 0.5  # the heuristic pushes toward the side of angle + 0.5 x angular velocity
LOGNORMAL_MAX_STEPS = 1000
LOGNORMAL_MEAN_FRACTION = 0.1  # mean / max of the lognormal lengths
LOGNORMAL_SIGMA = 1.0
FLASHBAX_ADD_STEPS = 65536  # steps per flashbax `add` call while filling (one compiled shape)
VALID_CALLS = 20  # untimed calls whose windows measure the share of usable steps
VALID_KEYS = 1 << 30  # their keys: far from the timed calls'


def same_episode_fraction(episodes: np.ndarray) -> float:
    """The share of the steps of windows `episodes` ([B, W] episode ids) in the episode of their
    window's first step."""
    episodes = np.asarray(episodes)
    return float(np.mean(episodes == episodes[:, :1]))


def check_lengths(text: str) -> list[str]:
    """The `--lengths` names; raises ValueError for an unknown one."""
    kinds = parse_names(text)
    unknown = [k for k in kinds if k not in LENGTH_KINDS]
    if not kinds or unknown:
        raise ValueError(f"--lengths {unknown or text!r}: choose from {list(LENGTH_KINDS)}")
    return kinds


def longest_episode(kind: str, max_steps: int) -> int:
    """The longest episode a distribution can produce: what a padded table reserves per row.
    `max_steps` (0: the default) is the time limit of CartPole (its own, 500) or the lognormal's clip."""
    if max_steps:
        return max_steps
    if kind == "cartpole":
        import gymnasium

        return int(gymnasium.spec(CARTPOLE_ENV).max_episode_steps)
    return LOGNORMAL_MAX_STEPS


def clip_to_budget(lengths: np.ndarray, steps: int) -> np.ndarray:
    """The first episodes of `lengths` holding `steps` steps in all, the last one cut short to fit."""
    ends = np.cumsum(lengths)
    count = int(np.searchsorted(ends, steps)) + 1
    kept = lengths[:count].astype(np.int64)
    kept[-1] -= int(ends[count - 1]) - steps
    return kept


@functools.lru_cache(maxsize=8)
def cartpole_lengths(steps: int, max_steps: int, seed: int = 0) -> np.ndarray:
    """int64 lengths of real gymnasium CartPole-v1 episodes, `steps` steps in all (the last cut short).

    The policy pushes the cart toward the side the pole falls to (action 1 when angle + 0.5 x angular
    velocity > 0) and acts at random with probability epsilon, drawn per episode uniformly in [0, 1]:
    the episodes of a training run, from exploring to balancing until the time limit.
    """
    import gymnasium

    env = gymnasium.make(CARTPOLE_ENV, max_episode_steps=max_steps)
    rng = np.random.default_rng(seed)
    lengths: list[int] = []
    total = 0
    with progress(steps, f"{CARTPOLE_ENV} episodes") as bar:
        obs, _ = env.reset(seed=seed)
        while total < steps:
            epsilon, length, done = rng.uniform(), 0, False
            while not done:
                if rng.uniform() < epsilon:
                    action = int(rng.integers(2))
                else:
                    action = int(obs[2] + CARTPOLE_LEAN_GAIN * obs[3] > 0)
                obs, _, terminated, truncated, _ = env.step(action)
                length += 1
                done = terminated or truncated
            lengths.append(length)
            total += length
            bar.update(length)
            obs, _ = env.reset()
    env.close()
    return clip_to_budget(np.asarray(lengths), steps)


def lognormal_lengths(steps: int, max_steps: int, seed: int = 0) -> np.ndarray:
    """int64 lengths, lognormal with sigma 1 and mean a tenth of `max_steps`, rounded and clipped to
    [1, max_steps], `steps` steps in all (the last cut short)."""
    rng = np.random.default_rng(seed)
    mean = LOGNORMAL_MEAN_FRACTION * max_steps
    mu = np.log(mean) - LOGNORMAL_SIGMA**2 / 2
    count = int(steps / mean * 1.5) + 16
    lengths = np.clip(np.rint(rng.lognormal(mu, LOGNORMAL_SIGMA, count)), 1, max_steps).astype(np.int64)
    while lengths.sum() < steps:
        more = np.rint(rng.lognormal(mu, LOGNORMAL_SIGMA, count))
        lengths = np.concatenate([lengths, np.clip(more, 1, max_steps).astype(np.int64)])
    return clip_to_budget(lengths, steps)


def episode_lengths(kind: str, steps: int, max_steps: int) -> np.ndarray:
    """The lengths of the `kind` distribution, `steps` steps in all."""
    if kind == "cartpole":
        return cartpole_lengths(steps, max_steps)
    return lognormal_lengths(steps, max_steps)


class EpisodeData:
    """Episodes of the given lengths, steps of `step_bytes` uint8 each, back to back in one stream.

    Step g of the stream is random pool row g % 256 with, when it has 8 bytes, its episode id and its
    step within the episode in its first 8 bytes (little endian uint32), so that a gathered step can be
    checked. Steps are made chunk by chunk (about 64 MiB): no system needs a second full copy.
    """

    def __init__(self, lengths: np.ndarray, step_bytes: int, max_steps: int, seed: int = 0):
        self.lengths = np.asarray(lengths, np.int64)
        self.step_bytes = step_bytes
        self.max_steps = max_steps
        self.seed = seed
        self.ends = np.cumsum(self.lengths)
        self.starts = self.ends - self.lengths
        rng = np.random.default_rng(seed)
        self.pool = rng.integers(0, 256, (POOL_ROWS, step_bytes), dtype=np.uint8)

    @property
    def episodes(self) -> int:
        """Episodes held."""
        return len(self.lengths)

    @property
    def steps(self) -> int:
        """Steps held, all episodes together."""
        return int(self.ends[-1])

    @property
    def step_bytes_total(self) -> int:
        """Bytes of the steps themselves."""
        return self.steps * self.step_bytes

    def episode_ids(self, first: int, stop: int) -> np.ndarray:
        """int64[stop - first]: the episode of each step of the stream in [first, stop)."""
        return np.searchsorted(self.ends, np.arange(first, stop), side="right")

    def steps_between(self, first: int, stop: int) -> np.ndarray:
        """uint8[stop - first, step_bytes]: steps [first, stop) of the stream."""
        out = self.pool[np.arange(first, stop) % len(self.pool)]
        if self.step_bytes >= 8:
            episode = self.episode_ids(first, stop)
            stamp = np.stack([episode, np.arange(first, stop) - self.starts[episode]], axis=1)
            out[:, :8] = stamp.astype("<u4").view(np.uint8)
        return out

    def step_blocks(self, block_steps: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """Yields (uint8[n, step_bytes] steps, int64[n] episode ids) covering the stream in order, n =
        `block_steps` except in the last block."""
        for first in range(0, self.steps, block_steps):
            stop = min(self.steps, first + block_steps)
            yield self.steps_between(first, stop), self.episode_ids(first, stop)

    def padded_chunks(self) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """Yields (uint8[n, max_steps, step_bytes] episodes zero-padded to max_steps, int64[n] lengths)
        covering every episode in order, about 64 MiB of padded steps each."""
        per_chunk = max(1, CHUNK_BYTES // (self.max_steps * self.step_bytes))
        for e in range(0, self.episodes, per_chunk):
            lengths = self.lengths[e : e + per_chunk]
            out = np.zeros((len(lengths), self.max_steps, self.step_bytes), np.uint8)
            out[np.arange(self.max_steps) < lengths[:, None]] = self.steps_between(
                int(self.starts[e]), int(self.ends[e + len(lengths) - 1])
            )
            yield out, lengths


class EpisodeWorkload:
    """What each step does: B windows of `window` steps from the episodes of `data`."""

    def __init__(self, data: EpisodeData, window: int):
        self.data = data
        self.window = window

    def bytes_per_step(self, batch_size: int) -> int:
        """Bytes of the windows one step of `batch_size` returns."""
        return batch_size * self.window * self.data.step_bytes


class EpisodeSystem(System):
    """A system holding the episodes; subclasses fill themselves and say what they hold in `nbytes`.

    `valid_fraction[B]`: the share of the steps of B windows that a learner can use (inside the
    episode the window starts in), measured on VALID_CALLS untimed calls before the timed ones (see
    `usable_fraction`); absent where a system's windows cannot be read back here (Reverb's)."""

    work: EpisodeWorkload
    memory_measured_as = ""

    def __init__(self, work: EpisodeWorkload):
        super().__init__(work)
        self.valid_fraction: dict[int, float] = {}

    def work_per_step(self, batch_size: int) -> tuple[int, int]:
        return batch_size, self.work.bytes_per_step(batch_size)

    def usable_fraction(self, result: Any) -> float:
        """The share of the steps of one call's windows (`result`, what the step returns) a learner
        can use."""
        raise NotImplementedError

    def measure_valid(self, step: Callable[[int], Any], batch_size: int) -> None:
        """Fills `valid_fraction[batch_size]` from VALID_CALLS calls of `step` at keys the timed calls
        do not use."""
        fractions = [self.usable_fraction(step(VALID_KEYS + i)) for i in range(VALID_CALLS)]
        self.valid_fraction[batch_size] = float(np.mean(fractions))

    def nbytes(self) -> int:
        """Bytes of host memory the system holds the episodes in (`memory_measured_as` says how)."""
        raise NotImplementedError


def index_bytes(episodes: int) -> int:
    """Bytes of gear_jax's episode index for `episodes` episodes: the mapping of a table of that many
    rows of one 1-byte step, less those bytes (each row's state, length, insert order and times
    sampled, the header and page rounding)."""
    spec = gj.TableSpec({"x": gj.Field((1,), "uint8")}, capacity=episodes)
    with gj.Table.create(spec, reuse=False) as table:
        return table.nbytes - episodes


class PaddedTableSystem(EpisodeSystem):
    """gear_jax's padded trajectory table: one row of `max_steps` steps per episode (`lengths` at
    insert); one jitted `gj.sample_gather(..., window=W)`: rows uniform, a window start uniform in
    each, windows of short episodes padded (`valid` False past the episode's end)."""

    name = PADDED
    memory_measured_as = "Table.nbytes: the table's shared-memory mapping (rows of max_steps steps, header)"
    sample_options: dict[str, Any] = {}

    def __init__(self, work: EpisodeWorkload, table: gj.Table | None = None):
        """Fills a new table with the episodes of `work`; or, given `table` (the episodes of `work`
        already in it, another system's), samples that one and leaves closing it to its owner."""
        super().__init__(work)
        data = work.data
        self.owns_table = table is None
        if table is not None:
            self.table = table
            return
        self.table = gj.Table.create(self.spec(data))
        try:
            with progress(data.steps, f"{self.name} fill") as bar:
                for episodes, lengths in data.padded_chunks():
                    self.table.insert({"x": episodes}, lengths=lengths)
                    bar.update(int(lengths.sum()))
            if self.table.size != data.episodes:
                raise RuntimeError(f"{self.name} holds {self.table.size} of {data.episodes} episodes")
        except BaseException:
            self.table.close()
            raise

    def spec(self, data: EpisodeData) -> gj.TableSpec:
        """The table's spec for `data`."""
        fields = {"x": gj.Field((data.step_bytes,), "uint8")}
        return gj.TableSpec(fields, capacity=data.episodes, max_steps=data.max_steps)

    def nbytes(self) -> int:
        return self.table.nbytes

    def make_step(self, batch_size: int) -> Step:
        table, window, options = self.table, self.work.window, self.sample_options

        @jax.jit
        def run(i: jax.Array) -> Any:
            key = jax.random.fold_in(jax.random.key(0), i)
            return gj.sample_gather(table, key, batch_size, window=window, fields=("x",), **options)[1]

        step = lambda i: jax.block_until_ready(run(i))  # noqa: E731
        self.measure_valid(step, batch_size)
        return step

    def usable_fraction(self, result: Any) -> float:
        return float(np.mean(np.asarray(result["valid"])))

    def describe(self) -> str:
        data = self.work.data
        return (
            f"{self.name} holds {data.episodes} episodes in rows of {data.max_steps} steps: "
            f"{self.table.nbytes / 2**20:.1f} MiB mapped for {data.step_bytes_total / 2**20:.1f} MiB of steps"
            + self.shared_note()
        )

    def shared_note(self) -> str:
        """What a system sampling another's table says of it (empty for a table of its own)."""
        if self.owns_table:
            return ""
        return f" (the table of {TABLE_OWNER[self.name]}, sampled with {self.sample_options})"

    def close(self) -> None:
        if self.owns_table:
            self.table.close()


class StepRingSystem(PaddedTableSystem):
    """gear_jax's step-ring trajectory table: `step_capacity` = the steps held, episodes back to back,
    one index row per episode; `gj.sample_gather(..., window=W, short_episodes="skip")`: windows
    uniform over every valid start, episodes shorter than W never picked."""

    name = GEAR
    memory_measured_as = "Table.nbytes: the table's shared-memory mapping (step ring, episode index, header)"
    sample_options = {"short_episodes": "skip"}

    def spec(self, data: EpisodeData) -> gj.TableSpec:
        fields = {"x": gj.Field((data.step_bytes,), "uint8")}
        try:
            spec = gj.TableSpec(
                fields, capacity=data.episodes, step_capacity=data.steps, max_steps=data.max_steps
            )
        except TypeError as e:
            raise Unavailable(f"this gear_jax has no step-ring tables (TableSpec(step_capacity=...): {e})")
        if not getattr(spec, "step_ring", False):
            raise Unavailable("this gear_jax has no step-ring tables (TableSpec.step_ring is not True)")
        return spec

    def describe(self) -> str:
        data = self.work.data
        return (
            f"{self.name} holds {data.episodes} episodes in a ring of {data.steps} steps: "
            f"{self.table.nbytes / 2**20:.1f} MiB mapped for {data.step_bytes_total / 2**20:.1f} MiB of steps"
            + self.shared_note()
        )


class PaddedSkipSystem(PaddedTableSystem):
    """The padded table sampled with `short_episodes="skip"`, as the ring is by default: rows uniform
    among the episodes of at least W steps, every window W steps of its episode (the ring's work per
    call, by another law: a row, then a start)."""

    name = PADDED_SKIP
    sample_options = {"short_episodes": "skip"}


class FlashbaxEpisodeSystem(EpisodeSystem):
    """flashbax's trajectory buffer with one lane of exactly the steps held (`max_length_time_axis`),
    the episodes added back to back with an int32 episode id per step (what a learner masks windows
    with); jitted `sample`: window starts uniform over the lane (period 1). Its windows cross episode
    boundaries: the buffer knows no episodes."""

    name = "flashbax"
    memory_measured_as = "nbytes of the buffer state's arrays (steps, int32 episode ids, indices)"

    def __init__(self, work: EpisodeWorkload):
        super().__init__(work)
        try:
            import flashbax as fbx
        except ImportError as e:
            raise Unavailable(f"flashbax is not installed ({e})") from None
        self.fbx = fbx
        data = work.data
        if data.steps < work.window:
            raise Unavailable(f"flashbax needs at least a window of steps ({data.steps} < {work.window})")
        buffer = self._buffer(1)
        example = {"x": jnp.zeros((data.step_bytes,), jnp.uint8), "episode": jnp.zeros((), jnp.int32)}
        self.state = buffer.init(example)
        add = jax.jit(buffer.add, donate_argnums=0)
        with progress(data.steps, f"{self.name} fill") as bar:
            for steps, episodes in data.step_blocks(min(FLASHBAX_ADD_STEPS, data.steps)):
                batch = {"x": steps[None], "episode": episodes[None].astype(np.int32)}
                self.state = add(self.state, batch)
                bar.update(len(steps))
        jax.block_until_ready(self.state)

    def _buffer(self, batch_size: int) -> Any:
        work = self.work
        return self.fbx.make_trajectory_buffer(
            add_batch_size=1,
            sample_batch_size=batch_size,
            sample_sequence_length=work.window,
            period=1,
            min_length_time_axis=work.window,
            max_length_time_axis=work.data.steps,
        )

    def nbytes(self) -> int:
        return sum(int(x.nbytes) for x in jax.tree_util.tree_leaves(self.state))

    def make_step(self, batch_size: int) -> Step:
        sample = jax.jit(self._buffer(batch_size).sample)
        key = jax.random.key(0)
        step = lambda i: jax.block_until_ready(sample(self.state, jax.random.fold_in(key, i)))  # noqa: E731
        self.measure_valid(step, batch_size)
        return step

    def usable_fraction(self, result: Any) -> float:
        return same_episode_fraction(result.experience["episode"])  # windows cross episodes

    def close(self) -> None:
        jax.tree_util.tree_map(lambda x: x.delete(), self.state)


class TorchrlEpisodeSystem(EpisodeSystem):
    """torchrl: `ReplayBuffer(LazyTensorStorage(steps), SliceSampler(slice_len=W, traj_key="episode",
    strict_length=True))`, the steps with an int64 episode id each; `rb.sample(batch_size=B * W)`:
    episodes of at least W steps uniform, then a window start uniform in each."""

    name = "torchrl"
    memory_measured_as = "nbytes of the LazyTensorStorage's tensors (steps, int64 episode ids)"

    def __init__(self, work: EpisodeWorkload):
        super().__init__(work)
        torch, rl = import_torchrl()
        from tensordict import TensorDict

        data = work.data
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                sampler = rl.SliceSampler(
                    slice_len=work.window, traj_key="episode", cache_values=True, strict_length=True
                )
        except Exception as e:  # noqa: BLE001 - e.g. its C++ extension does not load with this torch
            raise Unavailable(f"torchrl SliceSampler failed: {type(e).__name__}: {e}") from None
        self.storage = rl.LazyTensorStorage(data.steps)
        self.buffer = rl.ReplayBuffer(storage=self.storage, sampler=sampler)
        block = max(1, CHUNK_BYTES // data.step_bytes)
        with progress(data.steps, f"{self.name} fill") as bar:
            for steps, episodes in data.step_blocks(block):
                columns = {"x": torch.from_numpy(steps), "episode": torch.from_numpy(episodes)}
                self.buffer.extend(TensorDict(columns, batch_size=[len(steps)]))
                bar.update(len(steps))

    def nbytes(self) -> int:
        stored = self.storage._storage  # the TensorDict of preallocated columns
        return sum(t.numel() * t.element_size() for t in stored.values(include_nested=True, leaves_only=True))

    def make_step(self, batch_size: int) -> Step:
        picks = batch_size * self.work.window
        step = lambda i: self.buffer.sample(batch_size=picks)  # noqa: E731
        self.measure_valid(step, batch_size)
        return step

    def usable_fraction(self, result: Any) -> float:
        return same_episode_fraction(result["episode"].reshape(-1, self.work.window).numpy())

    def close(self) -> None:
        del self.buffer, self.storage


class ReverbEpisodeSystem(EpisodeSystem):
    """Reverb: a local server in another interpreter (`benchmarks/reverb_worker.py`, its episodes
    workload): the steps appended one by one through a `TrajectoryWriter`, one item per window of W
    steps inside an episode (every valid start; episodes shorter than W make none), uniform sampling
    through `reverb.TrajectoryDataset`. It fills and samples in one run of the worker, so its memory is
    known once its windows are timed."""

    name = "reverb"
    interleavable = False  # timed inside its worker process
    memory_measured_as = (
        "growth of the Reverb worker's resident memory (VmRSS) while its server took the episodes"
    )

    def __init__(self, work: EpisodeWorkload, python: str | None, timeout_s: float):
        super().__init__(work)
        if not python:
            raise Unavailable(
                "Reverb needs --reverb_python=PATH (an interpreter with dm-reverb; see docs/BENCHMARKS.md)"
            )
        self.python = python
        self.timeout_s = timeout_s
        self.result: dict[str, Any] | None = None

    def latencies(
        self, batch_sizes: list[int], warmup: int, iters: int, tick: Callable[[], None]
    ) -> dict[int, np.ndarray]:
        data = self.work.data
        config = {
            "episode_lengths": data.lengths.tolist(),
            "step_bytes": data.step_bytes,
            "window": self.work.window,
            "seed": data.seed,
            "batch_sizes": batch_sizes,
            "warmup": warmup,
            "iters": iters,
        }
        self.result = run_worker(self.python, config, self.timeout_s)
        memory = self.result["memory"]
        if memory["items"] != memory["items_expected"]:
            raise Unavailable(f"Reverb's table holds {memory['items']} items, not {memory['items_expected']}")
        for _ in range(len(batch_sizes) * iters):
            tick()
        return {int(b): np.asarray(v) for b, v in self.result["sample"].items()}

    def nbytes(self) -> int:
        if self.result is None:
            raise RuntimeError("Reverb's memory is measured in the run that times its windows")
        return int(self.result["memory"]["rss_growth_bytes"])

    def describe(self) -> str | None:
        if self.result is None:
            return None
        r = self.result
        return (
            f"reverb {r['versions']}: {r['memory']['items']} window items over {r['insert']['steps']} steps; "
            f"appending them took {r['insert']['seconds']:.1f} s"
        )


EPISODE_SYSTEMS: dict[str, type[EpisodeSystem]] = {
    GEAR: StepRingSystem,
    PADDED: PaddedTableSystem,
    PADDED_SKIP: PaddedSkipSystem,
    "flashbax": FlashbaxEpisodeSystem,
    "torchrl": TorchrlEpisodeSystem,
}


# Systems that sample another system's table when it is open (with --interleave), and that system.
TABLE_OWNER = {PADDED_SKIP: PADDED}


def memory_figures(system: EpisodeSystem, index: int) -> dict[str, Any]:
    """The `memory` of a record: bytes held, per stored step, and as ratios to the steps' own bytes
    and to those plus gear_jax's episode index (`index` bytes)."""
    data = system.work.data
    held = system.nbytes()
    return {
        "bytes": held,
        "bytes_per_step": held / data.steps,
        "ratio_to_step_bytes": held / data.step_bytes_total,
        "ratio_to_steps_and_index": held / (data.step_bytes_total + index),
        "step_bytes_total": data.step_bytes_total,
        "index_bytes": index,
        "measured_as": system.memory_measured_as,
    }


def cap_steps(
    requested: int, lengths: np.ndarray, max_steps: int, step_bytes: int, args: argparse.Namespace
) -> int:
    """The largest step budget <= `requested` whose systems fit in `--mem_budget_gib`, as `data.cap_rows`
    caps tables: the largest system (the padded table, one row of max_steps steps per episode) twice
    when the systems run one at a time; with `--interleave`, every system at once and the steps' bytes
    once more (room for filling), a system that samples another's table (TABLE_OWNER) counted once.
    Systems other than the padded tables count the steps' own bytes."""
    padded = len(lengths) * max_steps * step_bytes
    sizes = [
        padded if PADDED in (name, TABLE_OWNER.get(name)) else requested * step_bytes
        for name in args.systems
        if name in EPISODE_SYSTEMS and not (args.interleave and TABLE_OWNER.get(name) in args.systems)
    ]
    if not sizes:
        return requested
    needed = sum(sizes) + requested * step_bytes if args.interleave else 2 * max(sizes)
    limit = int(args.mem_budget_gib * 2**30)
    return requested if needed <= limit else max(1, int(requested * limit / needed))


def run(args: argparse.Namespace, note: Callable[[str], None]) -> list[dict[str, Any]]:
    """Records for every length distribution x step budget x step size x batch size x system.

    Each record carries `memory` (see `memory_figures`). Step budgets are capped so that the systems
    fit in `--mem_budget_gib` (`cap_steps`; a note says so). With `--interleave K` every system holds
    its episodes at once and they take turns of K timed steps, as in the gather suite.
    """
    window = args.window or DEFAULT_WINDOW
    batch_sizes = parse_ints(args.batch_size)
    records = []
    for kind in check_lengths(args.lengths):
        max_steps = longest_episode(kind, args.max_steps)
        if window > max_steps:
            raise ValueError(f"--window={window} is longer than the longest {kind} episode ({max_steps})")
        for requested in parse_ints(args.steps):
            for step_bytes in parse_ints(args.step_bytes):
                lengths = episode_lengths(kind, requested, max_steps)
                steps = cap_steps(requested, lengths, max_steps, step_bytes, args)
                if steps < requested:
                    held = (
                        "every system and the padded table once more"
                        if args.interleave
                        else "two padded tables"
                    )
                    note(
                        f"lengths={kind} step_bytes={step_bytes}: steps capped from {requested} to {steps} "
                        f"(--mem_budget_gib={args.mem_budget_gib} must hold {held})"
                    )
                    lengths = clip_to_budget(lengths, steps)
                data = EpisodeData(lengths, step_bytes, max_steps)
                note(describe_lengths(kind, data, window))
                point = {"lengths": kind, "steps": requested, "step_bytes": step_bytes, "window": window}
                records += measure_point(EpisodeWorkload(data, window), point, batch_sizes, args, note)
    print_memory(records)
    print_valid_steps(records)
    print_like_for_like(records)
    return records


def describe_lengths(kind: str, data: EpisodeData, window: int) -> str:
    """One line about the episodes of a point."""
    lengths = data.lengths
    short = lengths < window
    return (
        f"lengths={kind}: {data.episodes} episodes, {data.steps} steps of {data.step_bytes} B, length mean "
        f"{lengths.mean():.1f}, median {np.median(lengths):.0f}, max {lengths.max()} (rows reserve "
        f"{data.max_steps}: mean / max {lengths.mean() / data.max_steps:.3f}); "
        f"{short.mean():.1%} of the episodes, {lengths[short].sum() / data.steps:.1%} "
        f"of the steps, are in episodes shorter than the window ({window})"
    )


def measure_point(
    work: EpisodeWorkload,
    point: dict[str, Any],
    batch_sizes: list[int],
    args: argparse.Namespace,
    note: Callable[[str], None],
) -> list[dict[str, Any]]:
    """The records of every system at `point`, each with the memory the system held the episodes in."""
    index = index_bytes(work.data.episodes)
    memory: dict[str, dict[str, Any]] = {}
    made: dict[str, EpisodeSystem] = {}
    reverb: list[ReverbEpisodeSystem] = []

    def make(name: str) -> System:
        if name == "reverb":  # its memory is known once its windows are timed
            reverb.append(ReverbEpisodeSystem(work, args.reverb_python, args.reverb_timeout))
            return reverb[-1]
        owner = made.get(TABLE_OWNER.get(name, ""))
        if owner is not None and not owner.table.closed:  # --interleave: the same table, another law
            system = made[name] = EPISODE_SYSTEMS[name](work, table=owner.table)  # type: ignore[call-arg]
        else:
            system = made[name] = EPISODE_SYSTEMS[name](work)
        try:
            memory[name] = memory_figures(system, index)
        except BaseException:
            system.close()
            raise
        return system

    records = measure(work, point, OP, batch_sizes, args, note, make=make)
    for system in reverb:
        if system.result is not None:
            memory[system.name] = memory_figures(system, index)
    for r in records:
        r["memory"] = memory[r["system"]]
        system = made.get(r["system"])
        if system is not None and r["point"]["batch_size"] in system.valid_fraction:
            r["valid_step_fraction"] = system.valid_fraction[r["point"]["batch_size"]]
    add_valid_step_speedups(records)
    add_like_for_like(records)
    return records


def add_like_for_like(records: list[dict[str, Any]]) -> None:
    """Adds `like_for_like` (the system compared with) and `like_for_like_speedup` (its p50 over this
    record's) to the records of the systems in LIKE_FOR_LIKE, where both were timed at the point."""
    by_point = {(json_key(r["point"]), r["system"]): r for r in records}
    for r in records:
        other = by_point.get((json_key(r["point"]), LIKE_FOR_LIKE.get(r["system"], "")))
        if other is not None:
            r["like_for_like"] = other["system"]
            r["like_for_like_speedup"] = other["latency_s"]["p50"] / r["latency_s"]["p50"]


def add_valid_step_speedups(records: list[dict[str, Any]]) -> None:
    """Adds `valid_step_speedup_vs_<system>` to gear_jax's records: the speedup in usable steps per
    second (its `speedup_vs_<system>` x its valid step fraction / the system's), where both fractions
    are known. The speedup per call compares calls of B windows of W steps; a system whose windows hold
    padding or cross into other episodes gives a learner fewer usable steps per call."""
    for r in records:
        if r["system"] != GEAR or "valid_step_fraction" not in r:
            continue
        for other in records:
            usable = other.get("valid_step_fraction")
            if other["point"] != r["point"] or other["system"] == GEAR or not usable:
                continue
            per_call = other["latency_s"]["p50"] / r["latency_s"]["p50"]
            r[f"valid_step_speedup_vs_{other['system']}"] = per_call * r["valid_step_fraction"] / usable


def print_valid_steps(records: list[dict[str, Any]]) -> None:
    """Prints each system's share of usable steps per call and gear_jax's speedup in usable steps."""
    rows = [r for r in records if "valid_step_fraction" in r]
    if not rows:
        return
    table = RichTable(title="usable steps per call (inside the window's episode), gear_jax's speedup in them")
    for name in ("point", "system", "usable steps", "gear_jax speedup per call", "in usable steps/s"):
        table.add_column(name, justify="left" if name in ("point", "system") else "right")
    gear = {json_key(r["point"]): r for r in rows if r["system"] == GEAR}
    for r in rows:
        point = " ".join(f"{k}={v}" for k, v in r["point"].items())
        target = gear.get(json_key(r["point"]), {})
        per_call = r["latency_s"]["p50"] / target["latency_s"]["p50"] if target and target is not r else None
        usable = target.get(f"valid_step_speedup_vs_{r['system']}")
        table.add_row(
            point,
            r["system"],
            f"{r['valid_step_fraction']:.1%}",
            f"{per_call:.2f}x" if per_call is not None else "",
            f"{usable:.2f}x" if usable is not None else "",
        )
    console.print(table)


def print_like_for_like(records: list[dict[str, Any]]) -> None:
    """Prints the ring's speedup over the padded table doing the same work per call (LIKE_FOR_LIKE)."""
    rows = [r for r in records if "like_for_like" in r]
    if not rows:
        return
    table = RichTable(title="the same work per call: step ring against padded table, short_episodes alike")
    for name in ("point", "step ring", "padded table", "short_episodes", "ring p50", "padded p50", "speedup"):
        table.add_column(name, justify="left" if name in ("point", "step ring", "padded table") else "right")
    for r in rows:
        other = r["like_for_like"]
        p50 = r["latency_s"]["p50"]
        table.add_row(
            " ".join(f"{k}={v}" for k, v in r["point"].items()),
            r["system"],
            other,
            EPISODE_SYSTEMS[r["system"]].sample_options.get("short_episodes", "pad"),
            f"{p50 * 1e6:.1f} us",
            f"{p50 * r['like_for_like_speedup'] * 1e6:.1f} us",
            f"{r['like_for_like_speedup']:.2f}x",
        )
    console.print(table)


def json_key(point: dict[str, Any]) -> str:
    """A point as a hashable key."""
    return repr(sorted(point.items()))


def print_memory(records: list[dict[str, Any]]) -> None:
    """Prints the memory of each system at each point (one line per point and system)."""
    seen: dict[tuple[str, str], dict[str, Any]] = {}
    for r in records:
        key = (" ".join(f"{k}={v}" for k, v in r["point"].items() if k != "batch_size"), r["system"])
        seen.setdefault(key, r["memory"])
    if not seen:
        return
    table = RichTable(title="host memory per stored step")
    for name in ("point", "system", "bytes", "B/step", "x step bytes", "x steps + index"):
        table.add_column(name, justify="left" if name in ("point", "system") else "right")
    for (point, system), m in seen.items():
        table.add_row(
            point,
            system,
            f"{m['bytes'] / 2**20:.1f} MiB",
            f"{m['bytes_per_step']:.1f}",
            f"{m['ratio_to_step_bytes']:.3f}",
            f"{m['ratio_to_steps_and_index']:.3f}",
        )
    console.print(table)


def plot_report(report: dict[str, Any], path: str) -> bool:
    """Writes the suite's PNG to `path`: per length distribution (and step budget, step size, window),
    host bytes per stored step of each system against the step's own bytes, and the p50 latency of
    each system's sample + gather of B windows with a whisker to its p95. False (nothing written) for a
    report without records."""
    from gear_jax.bench.plot import plt

    records = report["records"]
    if not records:
        return False
    groups: dict[str, list[dict[str, Any]]] = {}
    for r in records:
        title = ", ".join(f"{k}={v}" for k, v in r["point"].items() if k != "batch_size")
        groups.setdefault(title, []).append(r)
    fig, axes = plt.subplots(len(groups), 2, figsize=(13, 0.6 + 2.6 * len(groups)), squeeze=False)
    for (memory_ax, speed_ax), (title, group) in zip(axes, groups.items()):
        memory = {r["system"]: r["memory"] for r in group}
        names = list(memory)
        memory_ax.barh(names, [memory[n]["bytes_per_step"] for n in names], color="C0")
        memory_ax.axvline(group[0]["point"]["step_bytes"], color="k", linestyle="--", label="step bytes")
        for y, n in enumerate(names):
            memory_ax.text(
                memory[n]["bytes_per_step"], y, f" {memory[n]['ratio_to_step_bytes']:.2f}x", va="center"
            )
        memory_ax.set_xlim(0, 1.2 * max(m["bytes_per_step"] for m in memory.values()))
        memory_ax.set_xlabel("host bytes per stored step")
        memory_ax.set_title(title, fontsize=9)
        memory_ax.legend(fontsize=7, loc="lower right")
        labels = [f"{r['system']} B={r['point']['batch_size']}" for r in group]
        p50 = np.array([r["latency_s"]["p50"] for r in group]) * 1e3
        p95 = np.array([r["latency_s"]["p95"] for r in group]) * 1e3
        speed_ax.barh(labels, p50, xerr=[np.zeros_like(p50), p95 - p50], color="C1", capsize=3)
        for y, (median, tail) in enumerate(zip(p50, p95)):
            speed_ax.text(tail, y, f" {median:.2f}", va="center", fontsize=8)
        speed_ax.set_xlim(0, 1.15 * p95.max())
        speed_ax.set_xlabel("sample + gather of B windows: p50 (whisker: p95), ms")
        speed_ax.grid(True, axis="x", which="both", alpha=0.3)
    machine = report["machine"]
    fig.suptitle(
        f"gear_jax.bench {report['suite']} - {machine['cpu']}, {machine['cpu_count']} cores", fontsize=10
    )
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)
    return True
