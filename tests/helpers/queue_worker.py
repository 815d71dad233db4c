"""One process of the queue and max_times_sampled tests (tests/multiprocess/test_queue_processes.py).

    python queue_worker.py ROLE TABLE_NAME [ARGS...]

Roles:
  learner DONE_FILE [PLATFORM]: prints "ready" once its step is compiled, waits for a line on stdin, then
    samples uniform batches of 16 (jitted sample + gather, on jax's first PLATFORM device: "cpu" or
    "gpu"; default jax's default device) until DONE_FILE exists (the writers are done) and the table
    has no selectable row left; prints the id of every valid pick, one per line, at the end, and on
    stderr how many calls failed and the last failure (a call fails when no row is selectable at
    that instant; a learner whose every call failed delivered nothing, which the tests refuse).
The table is attached pinned (registered with CUDA) where the role's programs run on a GPU, as a GPU
program needs.
  writer FIRST COUNT BATCH [PAUSE]: inserts ids FIRST .. FIRST + COUNT - 1 in batches of BATCH (PAUSE
    seconds apart), waiting while a queue is full; prints how many batches had to wait.
  consumer DONE_FILE BATCH [PAUSE]: dequeues batches of BATCH (jitted, PAUSE seconds apart) until
    DONE_FILE exists and the queue is empty; prints the ids of each batch on one line as soon as the
    dequeue returned (flushed), so that a consumer killed later has reported every batch it got but
    the one in flight.
"""

import os
import sys
import time

import jax
import numpy as np

import gear_jax as gj


def device_of(platform: str = "") -> jax.Device:
    """Where a role's programs run: jax's first `platform` device, or jax's default device."""
    return jax.devices(platform)[0] if platform else jax.devices()[0]


def learner(table: gj.Table, done_file: str, platform: str = "") -> None:
    with jax.default_device(device_of(platform)):
        learn(table, done_file)


def learn(table: gj.Table, done_file: str) -> None:
    step = jax.jit(lambda k: (lambda s: gj.gather(table, s))(gj.sample(table, k, 16)))
    step = step.lower(jax.random.key(0)).compile()
    print("ready", flush=True)
    sys.stdin.readline()  # "go": every learner is ready
    ids, i, failed, last_failure = [], 0, 0, None
    while not os.path.exists(done_file) or table.unconsumed > 0:
        i += 1
        try:
            batch = step(jax.random.key(os.getpid() * 100_003 + i))
            ok = np.asarray(batch["valid"])
        except gj.EXECUTION_ERRORS as e:  # nothing selectable at this instant (or a real failure: below)
            failed, last_failure = failed + 1, e
            time.sleep(0.001)
            continue
        ids += np.asarray(batch["id"])[ok].tolist()
    print("\n".join(map(str, ids)), flush=True)
    print(f"{failed} of {i} calls failed; the last: {last_failure}", file=sys.stderr, flush=True)


def writer(table: gj.Table, first: int, count: int, batch: int, pause: float = 0.0) -> None:
    waited = 0
    for start in range(first, first + count, batch):
        if pause:
            time.sleep(pause)
        rows = {"id": np.arange(start, min(start + batch, first + count), dtype=np.int64)}
        try:
            table.insert(rows, timeout=0)
        except gj.RateLimiterTimeout:
            waited += 1
            table.insert(rows, timeout=60)
    print(waited, flush=True)


def consumer(table: gj.Table, done_file: str, batch: int, pause: float = 0.0) -> None:
    take = jax.jit(lambda: gj.dequeue(table, batch))
    while True:
        if pause:
            time.sleep(pause)
        if table.unconsumed == 0:
            if os.path.exists(done_file) and table.unconsumed == 0:
                return
            time.sleep(0.001)
            continue
        _, out = take()
        ok = np.asarray(out["valid"])
        print(" ".join(map(str, np.asarray(out["id"])[ok].tolist())), flush=True)


def main() -> None:
    role, name, *args = sys.argv[1:]
    platform = args[1] if role == "learner" and len(args) > 1 else ""
    table = gj.Table.attach(name, pin=device_of(platform).platform == "gpu")
    if role == "learner":
        learner(table, *args)
    elif role == "writer":
        writer(table, int(args[0]), int(args[1]), int(args[2]), *map(float, args[3:]))
    elif role == "consumer":
        consumer(table, args[0], int(args[1]), *map(float, args[2:]))
    else:
        raise SystemExit(f"unknown role {role!r}")
    table.close()


if __name__ == "__main__":
    main()
