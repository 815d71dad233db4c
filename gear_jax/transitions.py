"""Transitions with n-step returns from trajectory tables, each observation stored once.

A transition table that stores `obs` and `next_obs` holds every observation twice. Here a trajectory
table (`TableSpec(max_steps > 1)`) holds runs of episodes instead, and transitions are read out of
windows of `n_step + 1` steps.

Row layout: one row holds a run of T transitions of one episode. Step t holds obs_t, action_t,
reward_t (the reward after action_t), terminated_t and truncated_t (gymnasium's flags from the step that
took action_t). After the run's last transition (the one whose terminated or truncated is True) comes
one step holding the final observation (that transition's next_obs; action and reward zero, flags
False), then n_step - 1 padding steps of the same content. A run of T transitions thus occupies
T + n_step steps, and a window of n_step + 1 steps has exactly T possible starts
(`gear_jax.sample` places windows uniformly over max(length - window, 0) + 1 starts): each transition is
the first step of exactly one window. The writer gives a row priority T, so that prioritized sampling
with exponent 1 picks every stored transition with the same probability, 1 / (transitions stored).

An episode longer than a row (at most max_steps - n_step transitions) is cut: the row's last
transition is marked truncated (bootstrapped like a truncation) and the episode goes on in a new row.

`transition_table_spec(..., transitions=N)` sizes the table in transitions (as a DQN's `buffer_size`):
a step ring that stores the runs back to back, without padding (see its docstring for what it holds);
`transition_table_spec(obs, action, capacity, max_steps)` sizes it in rows of max_steps steps.

    spec = transition_table_spec(env.observation_space, env.action_space, transitions=100_000, n_step=3)
    table = gj.Table.create(spec)
    with TransitionWriter(table, n_step=3) as episode_writer:       # in a gymnasium loop
        episode_writer.add(obs, action, reward, terminated, truncated, next_obs)
    t = sample_transitions(table, key, 256, n_step=3, gamma=0.99)   # inside jax.jit too
    target = t["reward"] + t["discount"] * q(t["next_obs"]).max(-1)  # masked by t["valid"]
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from gear_jax import _args, ops
from gear_jax.casting import to_numpy
from gear_jax.errors import InvalidArgumentError, SpecError
from gear_jax.spec import Field, TableSpec
from gear_jax.table import Table
from gear_jax.writers import EpisodeWriter

_ROLES = ("obs", "action", "reward", "terminated", "truncated")


EPISODES_PER_TRANSITIONS = 16  # `transitions=N` sizes the ring's episode index for runs of 16 on average


def transition_table_spec(
    obs: Any,
    action: Any,
    capacity: int | None = None,
    max_steps: int | None = None,
    *,
    transitions: int | None = None,
    n_step: int = 1,
    episodes: int | None = None,
    narrow: bool = True,
) -> TableSpec:
    """The spec of a table for `TransitionWriter`: fields obs, action, reward (float32 scalar),
    terminated and truncated (bool scalars).

    Sized in transitions, as a DQN replay buffer's `buffer_size`:
    `transition_table_spec(env.observation_space, env.action_space, transitions=10_000)` is a step ring
    (`TableSpec(step_capacity=...)`: runs of episodes back to back, no padding) that holds at least the
    latest `transitions` transitions when these span at most `episodes` runs; with shorter runs its
    index of `episodes` runs retires the oldest first, and it holds fewer. Its steps are
    `(transitions + n_step * episodes + max_steps) * 16 / 15`: room for each run's final observation
    and n_step - 1 padding steps, for the oldest run (retired whole) and for the sixteenth of the ring
    that writers retire ahead (docs/ARCHITECTURE.md, "Step rings"), so it holds somewhat more than
    `transitions` once full. New runs retire the oldest.

    Sized in rows (the original form): `transition_table_spec(obs, action, capacity, max_steps)` is a
    padded table of `capacity` rows of `max_steps` steps, each row one run of an episode of at most
    max_steps - n_step transitions, however short the run.

    Args:
      obs: the observation's `gear_jax.Field`, or a gymnasium or gymnax space (`Field.from_space`).
      action: the action's `gear_jax.Field`, or a space.
      capacity: rows (runs of episodes) of a padded table; not with `transitions`.
      max_steps: steps per row of a padded table; a row holds up to max_steps - n_step transitions, so it
        must be at least n_step + 1 (checked by the writer and the samplers). With `transitions`: the
        longest run (default min(transitions, 1000) + n_step steps; longer episodes are cut into runs).
      transitions: the transitions the table holds (a step ring, see above); not with `capacity`.
      n_step: the n of the n-step returns the table will be written and read with (`transitions` only:
        it sizes the ring's room for final observations and padding).
      episodes: `transitions` only: the runs the ring's index holds (default transitions / 16, at least 1).
      narrow: read a space's 64-bit dtypes as 32-bit (gymnasium's Discrete is int64), as `from_spaces`.

    Raises:
      InvalidArgumentError: obs or action is neither a Field nor a space gear_jax reads; both or neither
        of `capacity` and `transitions`; sizes that are not positive ints.
    """
    op = "transition_table_spec"
    fields = {}
    for name, value in (("obs", obs), ("action", action)):
        try:
            fields[name] = Field.from_space(value, narrow=narrow)
        except SpecError as e:
            raise InvalidArgumentError(
                f"{op}: {name} must be a gear_jax.Field or a gymnasium or gymnax space, got "
                f"{type(value).__name__} ({e}); write e.g. gj.Field((4,), 'float32') or "
                f"env.observation_space"
            ) from None
    fields.update(reward=Field((), "float32"), terminated=Field((), "bool"), truncated=Field((), "bool"))
    if transitions is None:
        if capacity is None or max_steps is None:
            raise InvalidArgumentError(
                f"{op}: give the size in transitions, transitions=N (as a DQN's buffer_size), or in rows, "
                f"capacity=rows and max_steps=steps per row; got capacity={capacity!r}, "
                f"max_steps={max_steps!r}"
            )
        if episodes is not None:
            raise InvalidArgumentError(f"{op}: episodes= sizes a table made with transitions=; drop it")
        return TableSpec(fields=fields, capacity=capacity, max_steps=max_steps)
    if capacity is not None:
        raise InvalidArgumentError(
            f"{op}: capacity={capacity!r} (rows) and transitions={transitions!r} both size the table; "
            "give one: transitions=N for N transitions, or capacity= and max_steps= for rows"
        )
    n = _check_n_step(n_step, op)
    count = _check_size(transitions, "transitions", op)
    runs = max(1, count // EPISODES_PER_TRANSITIONS) if episodes is None else None
    runs = _check_size(episodes, "episodes", op) if runs is None else runs
    longest = min(count, 1_000) + n if max_steps is None else _check_size(max_steps, "max_steps", op)
    # Retirement frees whole runs, and writers retire a sixteenth of the ring ahead of what they need.
    steps = -(-(count + n * runs + longest) * 16 // 15)
    return TableSpec(fields=fields, capacity=runs, max_steps=longest, step_capacity=steps)


def _check_size(value: Any, name: str, op: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise InvalidArgumentError(f"{op}: {name}={value!r} must be an int >= 1")
    return int(value)


def _check_n_step(n_step: Any, op: str) -> int:
    _args.check_static(n_step, "n_step", op)
    if isinstance(n_step, bool) or not isinstance(n_step, (int, np.integer)) or n_step < 1:
        raise InvalidArgumentError(f"{op}: n_step={n_step!r} must be an int >= 1")
    return int(n_step)


def _check_gamma(gamma: Any, op: str) -> Any:
    """A Python or numpy number must lie in [0, 1]; a traced value is taken as is."""
    if isinstance(gamma, (int, float, np.number)) and not isinstance(gamma, bool):
        if not (math.isfinite(float(gamma)) and 0.0 <= float(gamma) <= 1.0):
            raise InvalidArgumentError(f"{op}: gamma={gamma!r} must lie in [0, 1]")
        return float(gamma)
    if isinstance(gamma, bool) or jnp.ndim(gamma) != 0:
        raise InvalidArgumentError(f"{op}: gamma must be a scalar in [0, 1], got {gamma!r}")
    return gamma


def _names(op: str, names: Mapping[str, Any]) -> dict[str, str]:
    """The field names of the five roles, from the keyword arguments obs=, action=, ..."""
    unknown = sorted(set(names) - set(_ROLES))
    if unknown:
        raise InvalidArgumentError(
            f"{op}: unknown keyword arguments {unknown}; field names are given as {_ROLES}"
        )
    out = {role: names.get(role, role) for role in _ROLES}
    for role, name in out.items():
        if not isinstance(name, str):
            raise InvalidArgumentError(f"{op}: {role}= must be a field name (str), got {name!r}")
    if len(set(out.values())) != len(out):
        raise InvalidArgumentError(f"{op}: the five roles need five distinct fields, got {out}")
    return out


def _check_table(table: Any, n_step: int, names: dict[str, str], op: str) -> Table:
    """The table is open, a trajectory table with rows of at least n_step + 1 steps, and has the five
    fields, reward a float scalar and the flags bool scalars."""
    table = _args.check_table(table, op)
    spec = table.spec
    if spec.max_steps < n_step + 1:
        raise InvalidArgumentError(
            f"{op}: the table's max_steps={spec.max_steps} is too small for n_step={n_step}: a row holds "
            f"a transition, the final observation and {n_step - 1} padding steps, so max_steps must be at "
            f"least n_step + 1 = {n_step + 1}; create the table with a larger max_steps (rows of "
            "max_steps - n_step transitions) or use a smaller n_step"
        )
    fields = spec.fields
    missing = [f"{role}={name!r}" for role, name in names.items() if name not in fields]
    if missing:
        raise InvalidArgumentError(
            f"{op}: the table has no field for {', '.join(missing)}; its fields are {list(fields)}. "
            "Name the table's fields with the keyword arguments (obs=..., reward=...), or create the "
            "table from gear_jax.transitions.transition_table_spec(obs, action, capacity, max_steps)"
        )
    reward = fields[names["reward"]]
    if reward.shape != () or reward.dtype.kind != "f":
        raise InvalidArgumentError(
            f"{op}: the reward field {names['reward']!r} is {reward.shape} {reward.dtype.name}; it must be a "
            "float scalar per step: gj.Field((), 'float32')"
        )
    for role in ("terminated", "truncated"):
        field = fields[names[role]]
        if field.shape != () or field.dtype != np.dtype(bool):
            raise InvalidArgumentError(
                f"{op}: the {role} field {names[role]!r} is {field.shape} {field.dtype.name}; it must be a "
                "bool scalar per step: gj.Field((), 'bool')"
            )
    return table


class TransitionWriter:
    """Writes gymnasium transitions into a trajectory table, one run of an episode per row.

    Each `add` appends one transition. The transition that ends the episode (terminated or truncated)
    is followed by a step holding its next_obs and n_step - 1 padding steps, and the row is published
    with priority T (its number of transitions). A row holds at most max_steps - n_step transitions:
    the transition that fills it is marked truncated (a cut, bootstrapped like a truncation) and the row
    is published with that transition's next_obs as its final observation; the next `add` starts a new
    row, so an episode of any length can be written.

    The table must have exactly the five fields (obs, action, reward, terminated, truncated; their names
    can be changed with the keyword arguments): `transition_table_spec` makes such a spec. Use the writer
    as a context manager; `close()` abandons an unfinished run (its transitions are lost).

    Args:
      table: a trajectory table with max_steps >= n_step + 1.
      n_step: the n of the n-step returns that will be read (windows of n_step + 1 steps).
      obs: the table's field names for the five roles.
      action: the table's field names for the five roles.
      reward: the table's field names for the five roles.
      terminated: the table's field names for the five roles.
      truncated: the table's field names for the five roles.
    """

    def __init__(
        self,
        table: Table,
        n_step: int,
        *,
        obs: str = "obs",
        action: str = "action",
        reward: str = "reward",
        terminated: str = "terminated",
        truncated: str = "truncated",
    ):
        op = "TransitionWriter"
        self._n_step = _check_n_step(n_step, op)
        roles = {"obs": obs, "action": action, "reward": reward}
        self._names = _names(op, {**roles, "terminated": terminated, "truncated": truncated})
        self._table = _check_table(table, self._n_step, self._names, op)
        extra = sorted(set(table.spec.fields) - set(self._names.values()))
        if extra:
            raise InvalidArgumentError(
                f"{op}: the table has fields {extra} beyond the five it writes {list(self._names.values())}; "
                "every step writes every field, so use a table of these five fields only "
                "(transition_table_spec)"
            )
        self._writer: EpisodeWriter = table.writer()
        self._capacity = table.max_steps - self._n_step  # transitions per row
        fields = table.spec.fields
        self._obs_field = fields[self._names["obs"]]
        self._reward_dtype = fields[self._names["reward"]].dtype
        action_field = fields[self._names["action"]]
        self._final_extras = {
            self._names["action"]: np.zeros(action_field.shape, action_field.dtype),
            self._names["reward"]: np.zeros((), fields[self._names["reward"]].dtype),
            self._names["terminated"]: np.zeros((), bool),
            self._names["truncated"]: np.zeros((), bool),
        }
        self._steps = 0  # transitions in the open row
        self._transitions = 0  # transitions in published rows
        self._rows = 0

    @property
    def n_step(self) -> int:
        return self._n_step

    @property
    def transitions_per_row(self) -> int:
        """The most transitions one row holds: max_steps - n_step."""
        return self._capacity

    @property
    def steps(self) -> int:
        """Transitions in the open (unpublished) row."""
        return self._steps

    @property
    def transitions(self) -> int:
        """Transitions in the rows this writer published (abandoned runs not counted)."""
        return self._transitions

    @property
    def rows(self) -> int:
        """Rows this writer published."""
        return self._rows

    def add(
        self, obs: Any, action: Any, reward: Any, terminated: Any, truncated: Any, next_obs: Any
    ) -> int | None:
        """Appends one transition, as a gymnasium step gives it: `obs`, the `action` taken,
        and `reward, terminated, truncated` of `env.step(action)`, whose observation is `next_obs`.

        Values are stored as `EpisodeWriter.append` stores them (the table's dtype checks), except the
        reward, which is rounded to the reward field's float dtype (environments return Python floats
        or float64), and the flags, which are taken as Python bools.

        Returns:
          The row id when this transition published a row (the episode ended, or the row was full and
          the run was cut), else None.

        Raises:
          InvalidArgumentError: a value of the wrong shape or dtype. Nothing is written then, except
            when the table refuses the dtype of a next_obs that ends the row (a next_obs of obs's dtype
            never is): the run cannot be completed, so it is abandoned (its row emptied) and the error
            says how many transitions were lost.
        """
        n = self._names
        term = self._flag(terminated, "terminated")
        trunc = self._flag(truncated, "truncated")
        # Environments return rewards as Python or float64 numbers: rounded to the field's float dtype.
        reward_value = to_numpy(reward, "reward")
        if reward_value.shape != () or reward_value.dtype.kind not in "biuf":
            raise InvalidArgumentError(
                f"reward must be a real scalar, got shape {reward_value.shape} dtype {reward_value.dtype}"
            )
        reward_value = reward_value.astype(self._reward_dtype)
        # Check next_obs's shape before anything is written, so that a bad one leaves the row as it was.
        shape = getattr(next_obs, "shape", None)
        shape = tuple(np.shape(next_obs) if shape is None else shape)
        if shape != self._obs_field.shape:
            raise InvalidArgumentError(f"next_obs has shape {shape}, expected {self._obs_field.shape}")
        ends = term or trunc
        if not ends and self._steps + 1 >= self._capacity:
            trunc, ends = True, True  # the row is full: cut the run here, bootstrapped like a truncation
        step = {n["obs"]: obs, n["action"]: action, n["reward"]: reward_value}
        self._writer.append({**step, n["terminated"]: term, n["truncated"]: trunc})
        self._steps += 1
        if not ends:
            return None
        final = {n["obs"]: next_obs, **self._final_extras}
        try:
            for _ in range(self._n_step):  # the final observation, then n_step - 1 padding steps
                self._writer.append(final)
        except InvalidArgumentError as e:
            lost, self._steps = self._steps, 0
            self._writer.close()
            raise InvalidArgumentError(
                f"next_obs was refused ({e}); the run's {lost} transitions cannot be completed and were "
                "abandoned. Pass next_obs with obs's dtype"
            ) from e
        row = self._writer.end_episode(priority=float(self._steps))
        self._transitions += self._steps
        self._rows += 1
        self._steps = 0
        return row

    @staticmethod
    def _flag(value: Any, what: str) -> bool:
        array = to_numpy(value, what)
        if array.shape != () or array.dtype.kind not in "biu":
            raise InvalidArgumentError(
                f"{what} must be a bool scalar (gymnasium's flag), got shape {array.shape} "
                f"dtype {array.dtype}"
            )
        return bool(array)

    def close(self) -> None:
        """Abandons an unfinished run (its row becomes empty again). Idempotent."""
        self._writer.close()
        self._steps = 0

    def __enter__(self) -> TransitionWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def nstep_transitions(
    batch: Mapping[str, Any],
    n_step: int,
    gamma: Any,
    *,
    obs: str = "obs",
    action: str = "action",
    reward: str = "reward",
    terminated: str = "terminated",
    truncated: str = "truncated",
) -> dict[str, jax.Array]:
    """n-step transitions from the first step of each gathered window (pure jax.numpy: usable inside
    `jax.jit`, `jax.lax.scan` and `jax.vmap`).

    For each window, with j the first step in [0, n_step) whose terminated or truncated is set, the
    horizon is k = j + 1 (else n_step); reward = sum_{i<k} gamma^i reward_i (float32); discount = 0 when
    terminated_{k-1}, else gamma^k; next_obs = obs_k. The learner's target is
    `reward + discount * Q(next_obs)`.

    Args:
      batch: a `gear_jax.gather` result of windows, `[B, W, ...]` with W >= n_step + 1, and its `valid`
        mask (bool `[B, W]`), from a table written by `TransitionWriter`.
      n_step: n >= 1 (static).
      gamma: the discount, a scalar in [0, 1] (may be traced).
      obs: the batch's keys for the five roles.
      action: the batch's keys for the five roles.
      reward: the batch's keys for the five roles.
      terminated: the batch's keys for the five roles.
      truncated: the batch's keys for the five roles.

    Returns:
      A dict: obs and action (of step 0), reward (float32[B]), discount (float32[B]), next_obs, and valid
      (bool[B]: steps 0 and k of the window valid; False for a failed pick or a row overwritten since it
      was sampled, whose values are meaningless).
    """
    op = "nstep_transitions"
    n = _check_n_step(n_step, op)
    gamma = _check_gamma(gamma, op)
    roles = {"obs": obs, "action": action, "reward": reward, "terminated": terminated, "truncated": truncated}
    names = _names(op, roles)
    if not isinstance(batch, Mapping):
        raise InvalidArgumentError(
            f"{op}: batch must be a dict from gear_jax.gather, got {type(batch).__name__}"
        )
    missing = [name for name in (*names.values(), "valid") if name not in batch]
    if missing:
        raise InvalidArgumentError(
            f"{op}: batch has no {missing}; its keys are {sorted(batch)}. Gather these fields (with "
            "`valid`), or name the batch's keys with the keyword arguments (obs=..., reward=...)"
        )
    valid = jnp.asarray(batch["valid"])
    if valid.ndim != 2:
        raise InvalidArgumentError(
            f"{op}: batch['valid'] has shape {valid.shape}; expected [B, W]: gather windows of a trajectory "
            f"table (gear_jax.sample(..., window={n + 1}))"
        )
    b, w = valid.shape
    if w < n + 1:
        raise InvalidArgumentError(
            f"{op}: windows of {w} steps are too short for n_step={n}; sample windows of at least "
            f"n_step + 1 = {n + 1} steps (gear_jax.sample(..., window={n + 1}))"
        )
    arrays = {role: jnp.asarray(batch[name]) for role, name in names.items()}
    for role, array in arrays.items():
        scalar = role in ("reward", "terminated", "truncated")
        if array.shape[:2] != (b, w) or (scalar and array.ndim != 2):
            raise InvalidArgumentError(
                f"{op}: batch[{names[role]!r}] has shape {array.shape}; expected "
                f"{'[B, W]' if scalar else '[B, W, ...]'} with B, W = {b}, {w} as in batch['valid']"
            )

    term = arrays["terminated"][:, :n].astype(bool)
    done = term | arrays["truncated"][:, :n].astype(bool)
    k = jnp.where(done.any(axis=1), jnp.argmax(done, axis=1) + 1, n).astype(jnp.int32)  # horizon, [B]
    steps = jnp.arange(n, dtype=jnp.int32)
    powers = jnp.power(jnp.asarray(gamma, jnp.float32), jnp.arange(n + 1, dtype=jnp.float32))  # gamma^0..n
    rewards = arrays["reward"][:, :n].astype(jnp.float32)
    ret = jnp.sum(jnp.where(steps[None, :] < k[:, None], powers[None, :n] * rewards, 0.0), axis=1)
    terminal = jnp.take_along_axis(term, (k - 1)[:, None], axis=1)[:, 0]
    discount = jnp.where(terminal, jnp.float32(0.0), powers[k])
    observations = arrays["obs"]
    index = k.reshape((b, 1) + (1,) * (observations.ndim - 2))
    next_obs = jnp.take_along_axis(observations, index, axis=1)[:, 0]
    ok = valid[:, 0] & jnp.take_along_axis(valid, k[:, None], axis=1)[:, 0]
    return {
        "obs": observations[:, 0],
        "action": arrays["action"][:, 0],
        "reward": ret,
        "discount": discount,
        "next_obs": next_obs,
        "valid": ok,
    }


def sample_transitions(
    table: Table,
    key: jax.Array,
    batch_size: int,
    n_step: int,
    gamma: Any,
    **names: str,
) -> dict[str, jax.Array]:
    """`batch_size` n-step transitions, each stored transition equally likely.

    A prioritized sample (exponent 1) of windows of n_step + 1 steps from a table written by
    `TransitionWriter` (whose row priorities are their transition counts), gathered and passed to
    `nstep_transitions`. Usable inside `jax.jit`, with the table captured or passed as an argument.

    Args:
      table: the table (static).
      key: a JAX PRNG key; the same key gives the same transitions of the same table contents.
      batch_size: B >= 1 (static).
      n_step: n >= 1 (static); the table's max_steps must be at least n + 1.
      gamma: the discount in [0, 1].
      **names: field names for the roles (obs=, action=, reward=, terminated=, truncated=).

    Returns:
      `nstep_transitions`' dict: obs, action, reward, discount, next_obs, valid.
    """
    op = "sample_transitions"
    n = _check_n_step(n_step, op)
    roles = _names(op, names)
    _check_table(table, n, roles, op)
    smp = ops.sample(table, key, batch_size, method="prioritized", priority_exponent=1.0, window=n + 1)
    batch = ops.gather(table, smp, fields=list(roles.values()))
    return nstep_transitions(batch, n, gamma, **roles)
