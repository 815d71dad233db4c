"""The rate limiter shared by every process of a table (gear_jax/rate_limiter.py, xla_ffi/rate_limiter.h):
settings, counts, waits that end by admission, timeout or close, and the ratio kept by real processes."""

import signal
import subprocess
import threading
import time
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import gear_jax as gj
import gear_jax.cleanup
from tests.helpers.processes import start_python
from tests.helpers.waits import ON_NATIVE_CALL, on_native_call

TIMEOUT = 120  # seconds any process or wait of these tests may take at most
# Seconds a wait without a timeout may take to end once its table is closed, its creator dies or it is
# interrupted. The native waits poll every 1 ms at most, check the creator every 20 ms and signals every
# 100 ms, so ending at all (with the right error) proves the mechanism; the bound is far above those
# periods (a loaded CI machine may deschedule a process for a second or more) and far below TIMEOUT.
WOKEN_WITHIN = 10.0
FIELDS = {"x": gj.Field((), "int32")}


def limited(make_table, capacity=256, **settings):
    return make_table(fields=FIELDS, capacity=capacity, rate_limiter=gj.RateLimiter(**settings))


def rows(n, start=0):
    return {"x": np.arange(start, start + n, dtype=np.int32)}


def finish(proc: subprocess.Popen) -> str:
    """The process's output once it exited with status 0 (bounded by TIMEOUT)."""
    try:
        out, err = proc.communicate(timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        raise AssertionError(f"process still running after {TIMEOUT} s: {out}\n{err}") from None
    assert proc.returncode == 0, err
    return out


# -- settings ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "settings, names",
    [
        ({"min_size_to_sample": 0}, "min_size_to_sample"),
        ({"min_size_to_sample": 2.5}, "min_size_to_sample"),
        ({"min_size_to_sample": True}, "min_size_to_sample"),
        ({"samples_per_insert": 0, "error_buffer": 5}, "samples_per_insert"),
        ({"samples_per_insert": -1, "error_buffer": 5}, "samples_per_insert"),
        ({"samples_per_insert": float("nan"), "error_buffer": 5}, "samples_per_insert"),
        ({"samples_per_insert": "4", "error_buffer": 5}, "samples_per_insert"),
        ({"samples_per_insert": 4}, "error_buffer"),
        ({"error_buffer": 4}, "error_buffer"),
        ({"samples_per_insert": 4, "error_buffer": float("inf")}, "error_buffer"),
        ({"samples_per_insert": 4, "error_buffer": 2}, "error_buffer"),  # (4 + 1) / 2 = 2.5 at least
        ({"samples_per_insert": 0.5, "error_buffer": 0.5}, "error_buffer"),  # 0.75 at least
    ],
)
def test_bad_settings_are_refused_naming_the_argument(settings, names):
    with pytest.raises(gj.InvalidArgumentError, match=names):
        gj.RateLimiter(**settings)


def test_smallest_error_buffer_is_accepted_and_bounds_follow():
    r = gj.RateLimiter(min_size_to_sample=10, samples_per_insert=4, error_buffer=2.5)
    assert (r.min_diff, r.max_diff) == (37.5, 42.5)
    assert gj.RateLimiter(min_size_to_sample=3).min_diff is None


def test_create_refuses_a_min_size_above_capacity_and_other_types(make_table):
    with pytest.raises(
        gj.InvalidArgumentError, match="min_size_to_sample=17 is more than the table's capacity"
    ):
        limited(make_table, capacity=16, min_size_to_sample=17)
    with pytest.raises(gj.InvalidArgumentError, match="rate_limiter must be a gear_jax.RateLimiter"):
        make_table(fields=FIELDS, rate_limiter={"min_size_to_sample": 1})


def test_settings_are_in_the_header_for_every_open(make_table):
    settings = gj.RateLimiter(min_size_to_sample=5, samples_per_insert=0.5, error_buffer=3)
    table = make_table(fields=FIELDS, capacity=64, rate_limiter=settings)
    assert table.rate_limiter == settings
    with gj.Table.attach(table.name) as other:
        assert other.rate_limiter == settings
        other.insert(rows(3))
        assert other.rate_limiter_counts() == table.rate_limiter_counts()
    assert make_table(fields=FIELDS).rate_limiter is None


def test_a_table_from_the_pool_takes_the_new_settings(make_table):
    gj.clear_pool()
    spec = gj.TableSpec(FIELDS, capacity=64)
    first = gj.Table.create(spec)
    first.insert(rows(8))
    first.close()
    reused_before = gj.pool_stats()["reused"]
    settings = gj.RateLimiter(min_size_to_sample=2, samples_per_insert=1, error_buffer=4)
    second = gj.Table.create(spec, rate_limiter=settings)
    third = None
    try:
        assert gj.pool_stats()["reused"] == reused_before + 1  # the memory of `first`
        assert second.rate_limiter == settings
        assert second.rate_limiter_counts() == gj.RateLimiterCounts(0, 0, 0, 0.0)
        second.insert(rows(5))
        second.close()
        third = gj.Table.create(spec)
        assert third.rate_limiter is None and third.rate_limiter_counts().inserts == 0
    finally:
        second.close()
        if third is not None:
            third.close()


# -- counts -----------------------------------------------------------------------------------------


def test_every_host_insert_path_counts_its_rows(make_table):
    table = limited(make_table, min_size_to_sample=1, samples_per_insert=1, error_buffer=100)
    table.insert(rows(5))
    table.add({"x": 7})  # the native short path
    table.add({"x": np.array(7, np.int64)})  # converted by the short path
    table.add(types.MappingProxyType({"x": 7}))  # the general path (not a dict)
    with table.writer() as w:
        w.append({"x": 1})
        w.end_episode()
    counts = table.rate_limiter_counts()
    assert counts == gj.RateLimiterCounts(inserts=9, samples=0, size=9, diff=9.0)
    table.await_samples(4)
    assert table.rate_limiter_counts() == gj.RateLimiterCounts(inserts=9, samples=4, size=9, diff=5.0)


def test_trajectory_add_counts_once(make_table):
    table = make_table(
        fields=FIELDS,
        max_steps=4,
        rate_limiter=gj.RateLimiter(min_size_to_sample=1, samples_per_insert=2, error_buffer=10),
    )
    table.add({"x": np.arange(3, dtype=np.int32)})
    assert table.rate_limiter_counts().inserts == 1 and table.size == 1


def test_publication_without_admission_counts_without_waiting(make_table):
    """The insert custom call's way (SharedTable::Insert without a reservation: rows counted as
    published, never waiting): the count may pass max_diff, and host inserts then wait."""
    table = limited(make_table, min_size_to_sample=1, samples_per_insert=1, error_buffer=2)  # max_diff 3
    for _ in range(5):
        table.native.insert([rows(1)["x"]], 1, 1, None, None, admit=False)
    assert table.rate_limiter_counts() == gj.RateLimiterCounts(inserts=5, samples=0, size=5, diff=5.0)
    with pytest.raises(gj.RateLimiterTimeout):
        table.insert(rows(1), timeout=0)


def test_inserts_inside_jit_count_and_never_wait(make_table):
    """gj.insert inside a jitted program counts its rows as inserts and never blocks the program, even
    past max_diff; a host insert then waits for the learner."""
    table = limited(make_table, min_size_to_sample=1, samples_per_insert=1, error_buffer=2)  # max_diff 3
    step = jax.jit(
        lambda x: jax.lax.scan(lambda c, i: (c, gj.insert(table, {"x": x + i})), None, jnp.arange(3))[1]
    )
    jax.block_until_ready(step(jnp.arange(2, dtype=jnp.int32)))
    assert table.rate_limiter_counts() == gj.RateLimiterCounts(inserts=6, samples=0, size=6, diff=6.0)
    with pytest.raises(gj.RateLimiterTimeout):
        table.insert(rows(1), timeout=0)
    table.await_samples(4)  # diff 2: one more host row fits
    table.insert(rows(1), timeout=0)
    assert table.rate_limiter_counts() == gj.RateLimiterCounts(inserts=7, samples=4, size=7, diff=3.0)


def test_without_a_limiter_nothing_waits_and_nothing_counts(make_table):
    table = make_table(fields=FIELDS, capacity=16)
    assert table.rate_limiter is None and not table.can_sample(1)
    with pytest.raises(gj.RateLimiterTimeout, match="size=0"):
        table.await_samples(1, timeout=0.05)  # without a limiter, a sample waits for a first row only
    for i in range(10):
        table.insert(rows(8), timeout=0)
        table.add({"x": i}, timeout=0)
    with table.writer() as w:
        w.append({"x": 1})
        w.end_episode(timeout=0)
    assert table.can_sample(1_000_000)
    table.await_samples(1_000_000, timeout=0)
    assert table.rate_limiter_counts() == gj.RateLimiterCounts(inserts=0, samples=0, size=16, diff=None)


def test_min_size_only_counts_and_never_holds_inserts(make_table):
    table = limited(make_table, capacity=64, min_size_to_sample=10)
    for _ in range(20):
        table.insert(rows(8), timeout=0)
    table.await_samples(10_000, timeout=0)  # no ratio: any number of samples once the size is there
    assert table.rate_limiter_counts() == gj.RateLimiterCounts(
        inserts=160, samples=10_000, size=64, diff=None
    )


@pytest.mark.parametrize("bad", [-1, float("nan"), "1", True])
def test_bad_timeouts_and_counts_are_refused(make_table, bad):
    table = limited(make_table, min_size_to_sample=1)
    with pytest.raises(gj.InvalidArgumentError, match="timeout"):
        table.insert(rows(1), timeout=bad)
    with pytest.raises(gj.InvalidArgumentError, match="timeout"):
        table.await_samples(1, timeout=bad)
    with pytest.raises(gj.InvalidArgumentError, match="n="):
        table.await_samples(0)
    assert table.rate_limiter_counts().inserts == 0


# -- timeouts and refusals --------------------------------------------------------------------------


def test_await_samples_times_out_naming_the_counts(make_table):
    table = limited(make_table, min_size_to_sample=10, samples_per_insert=2, error_buffer=8)
    table.insert(rows(3))
    start = time.monotonic()
    with pytest.raises(gj.RateLimiterTimeout) as e:
        table.await_samples(4, timeout=0.5)
    waited = time.monotonic() - start
    assert 0.5 <= waited < 2.5, waited
    message = str(e.value)
    assert isinstance(e.value, TimeoutError) and isinstance(e.value, gj.GearJaxError)
    for part in ("await_samples(4)", "inserts=3", "samples=0", "size=3", "min_diff=12", "size >= 10"):
        assert part in message, (part, message)
    assert table.rate_limiter_counts().samples == 0


def test_an_insert_held_by_the_ratio_times_out_and_writes_nothing(make_table):
    table = limited(make_table, min_size_to_sample=4, samples_per_insert=2, error_buffer=4)  # max_diff 12
    table.insert(rows(6))  # diff 12: full
    before = table.row_status()
    start = time.monotonic()
    with pytest.raises(gj.RateLimiterTimeout) as e:
        table.insert(rows(1, 100), timeout=0.3)
    assert 0.3 <= time.monotonic() - start < 2.3
    for part in ("insert of 1 rows", "inserts=6", "diff = inserts x 2 - samples = 12", "max_diff=12"):
        assert part in str(e.value), (part, str(e.value))
    with pytest.raises(gj.RateLimiterTimeout):
        table.add({"x": 100}, timeout=0)
    with pytest.raises(gj.RateLimiterTimeout):
        table.add(types.MappingProxyType({"x": 100}), timeout=0)  # the general path
    after = table.row_status()
    for key in before:
        np.testing.assert_array_equal(before[key], after[key])
    assert table.rate_limiter_counts() == gj.RateLimiterCounts(inserts=6, samples=0, size=6, diff=12.0)
    table.await_samples(2)  # room for one row again
    table.add({"x": 100}, timeout=0)
    assert table.rate_limiter_counts() == gj.RateLimiterCounts(inserts=7, samples=2, size=7, diff=12.0)


def test_an_episode_end_that_times_out_keeps_the_episode(make_table):
    table = make_table(
        fields=FIELDS,
        max_steps=3,
        rate_limiter=gj.RateLimiter(min_size_to_sample=1, samples_per_insert=1, error_buffer=1),
    )  # max_diff 2
    table.insert({"x": np.zeros((2, 3), np.int32)})
    with table.writer() as w:
        w.append({"x": 1})
        w.append({"x": 2})
        with pytest.raises(gj.RateLimiterTimeout):
            w.end_episode(timeout=0.05)
        assert w.steps == 2 and table.size == 2
        table.await_samples(1)
        row = w.end_episode(timeout=0)
    assert table.row_status()["length"][row] == 2
    assert table.rate_limiter_counts() == gj.RateLimiterCounts(inserts=3, samples=1, size=3, diff=2.0)


def test_batches_larger_than_the_tolerance(make_table):
    """A batch needing more room than 2 x error_buffer goes in only while the table fills; later it is
    refused at once (it could never be admitted), naming the largest batch that can wait."""
    table = limited(make_table, min_size_to_sample=8, samples_per_insert=1, error_buffer=2)  # [6, 10]
    table.insert(rows(8))  # 8 > 4 = 2 x error_buffer, but it fits now: diff 0 -> 8
    with pytest.raises(gj.InvalidArgumentError, match="insert at most 4 rows at a time"):
        table.insert(rows(5))
    table.insert(rows(2), timeout=0)  # diff 10 = max_diff
    with pytest.raises(gj.InvalidArgumentError, match="sample at most 4 at a time"):
        table.await_samples(5)
    table.await_samples(4, timeout=0)
    assert table.rate_limiter_counts() == gj.RateLimiterCounts(inserts=10, samples=4, size=10, diff=6.0)


def test_torch_tensor_inserts_wait_and_give_back(make_table):
    torch = pytest.importorskip("torch")
    table = limited(make_table, min_size_to_sample=1, samples_per_insert=1, error_buffer=2)  # max_diff 3
    from gear_jax.torch import insert_tensors  # the path of CUDA tensors (tested with CPU ones)

    insert_tensors(table, {"x": torch.arange(2, dtype=torch.int32)})
    with pytest.raises(gj.RateLimiterTimeout):
        insert_tensors(table, {"x": torch.arange(2, dtype=torch.int32)}, timeout=0)
    assert table.size == 2
    insert_tensors(table, {"x": torch.arange(1, dtype=torch.int32)}, timeout=0)
    assert table.rate_limiter_counts() == gj.RateLimiterCounts(inserts=3, samples=0, size=3, diff=3.0)


# -- close ends waits -------------------------------------------------------------------------------


@pytest.mark.parametrize("closer", ["same_open", "creator_of_an_attached_open"])
@pytest.mark.parametrize("op", ["await_samples", "insert", "insert_one", "add", "end_episode"])
def test_close_from_another_thread_ends_a_wait(make_table, op, closer):
    table = limited(make_table, min_size_to_sample=4, samples_per_insert=1, error_buffer=1)  # [3, 5]
    table.insert(rows(5))  # inserts wait from here on, samples may go
    waiting = table if closer == "same_open" else gj.Table.attach(table.name)
    writer = waiting.writer()
    writer.append({"x": 1})
    if op == "await_samples":
        waiting.await_samples(2)  # the next sample waits
    calls = {  # each op's call, and the native call in which it waits
        "await_samples": (lambda: waiting.await_samples(1), "await_samples"),
        "insert": (lambda: waiting.insert(rows(2)), "insert"),
        "insert_one": (lambda: waiting.insert(rows(1)), "add"),  # a batch of one: the one-row short path
        "add": (lambda: waiting.add({"x": 1}), "add"),
        "end_episode": (writer.end_episode, "commit"),
    }
    call, native_call = calls[op]
    outcome = {}
    entered = threading.Event()

    def wait():
        on_native_call({native_call}, entered.set)
        try:
            call()
            outcome["returned"] = True
        except BaseException as e:  # reported to the test thread
            outcome["error"] = e
            outcome["at"] = time.monotonic()

    thread = threading.Thread(target=wait, daemon=True)
    thread.start()
    assert entered.wait(TIMEOUT), outcome
    assert thread.is_alive(), outcome  # still waiting
    closed_at = time.monotonic()
    table.close()
    thread.join(TIMEOUT)
    assert not thread.is_alive()
    assert isinstance(outcome.get("error"), gj.TableClosedError), outcome
    assert outcome["at"] - closed_at < WOKEN_WITHIN, outcome["at"] - closed_at  # ended by the close
    writer.close()  # gives the held row back, after the close too
    waiting.close()


@pytest.mark.multiprocess
def test_the_creators_close_ends_a_wait_in_another_process(make_table):
    table = limited(make_table, min_size_to_sample=10)
    waiter = start_python(
        ON_NATIVE_CALL
        + f"""
import time, gear_jax as gj
t = gj.Table.attach({table.name!r})
print(t.rate_limiter, flush=True)
on_native_call({{"await_samples"}}, lambda: print("waiting", flush=True))
try:
    t.await_samples(1)
except gj.TableClosedError:
    print(time.monotonic(), flush=True)
"""
    )
    assert waiter.stdout.readline().strip() == repr(table.rate_limiter)
    assert waiter.stdout.readline().strip() == "waiting"  # inside the native wait from now on
    closed_at = time.monotonic()
    table.close()
    woke_at = float(finish(waiter).strip())
    assert 0 <= woke_at - closed_at < WOKEN_WITHIN, woke_at - closed_at  # a wait without a timeout ended


@pytest.mark.multiprocess
@pytest.mark.parametrize("outlive_creator", [False, True])
def test_the_creators_death_ends_a_wait(outlive_creator):
    # An actor waiting in a rate-limited insert(timeout=None) for a learner (the table's creator) that is
    # SIGKILLed waited forever (issue 32's probe): the wait now ends with TableClosedError naming the
    # creator. A table made to outlive its creator keeps waiting for a new learner.
    creator = start_python(
        f"""
import time, gear_jax as gj
spec = gj.TableSpec({{"x": gj.Field((), "int32")}}, capacity=256)
limiter = gj.RateLimiter(min_size_to_sample=1, samples_per_insert=1, error_buffer=4)
t = gj.Table.create(spec, rate_limiter=limiter, outlive_creator={outlive_creator})
print(t.name, flush=True)
time.sleep(600)
"""
    )
    name = creator.stdout.readline().strip()
    outcome = {}
    with gj.Table.attach(name) as actor:

        def insert_until_held():
            try:
                for i in range(100):  # the limiter holds one of these until samples come
                    actor.insert(rows(1, i), timeout=None)
                outcome["error"] = None
            except Exception as e:  # reported below
                outcome["error"], outcome["at"] = e, time.monotonic()

        waiter = threading.Thread(target=insert_until_held, daemon=True)
        waiter.start()
        time.sleep(0.5)
        assert waiter.is_alive() and not outcome  # held by the limiter
        creator.send_signal(signal.SIGKILL)
        creator.communicate()
        killed_at = time.monotonic()
        waiter.join(2.0 if outlive_creator else TIMEOUT)
        if outlive_creator:
            assert waiter.is_alive() and not outcome  # still waiting for a learner
            actor.close()  # a close ends the wait
            waiter.join(TIMEOUT)
            assert isinstance(outcome["error"], gj.TableClosedError)
        else:
            assert isinstance(outcome.get("error"), gj.TableClosedError), outcome
            assert f"(pid {creator.pid}) died while an insert waited" in str(outcome["error"])
            assert outcome["at"] - killed_at < WOKEN_WITHIN  # the creator is checked every 20 ms
    gj.cleanup.remove_dead_tables(match=name, include_persistent=True)


@pytest.mark.multiprocess
def test_ctrl_c_ends_a_wait_without_a_timeout(make_table):
    table = limited(make_table, min_size_to_sample=10)
    waiter = start_python(
        ON_NATIVE_CALL
        + f"""
import time, gear_jax as gj
t = gj.Table.attach({table.name!r})
on_native_call({{"await_samples"}}, lambda: print("waiting", flush=True))
try:
    t.await_samples(1)
except KeyboardInterrupt:
    print(time.monotonic(), flush=True)
"""
    )
    assert waiter.stdout.readline().strip() == "waiting"  # inside the native wait from now on
    interrupted_at = time.monotonic()
    waiter.send_signal(signal.SIGINT)
    woke_at = float(finish(waiter).strip())
    assert 0 <= woke_at - interrupted_at < WOKEN_WITHIN, woke_at - interrupted_at  # signals: every 100 ms
    assert table.rate_limiter_counts().samples == 0


# -- real processes ---------------------------------------------------------------------------------


@pytest.mark.multiprocess
def test_samples_wait_for_the_minimum_size_inserted_by_another_process(make_table):
    table = limited(make_table, min_size_to_sample=10)
    assert not table.can_sample(1)
    inserter = start_python(
        f"""
        import sys, time, numpy as np, gear_jax as gj
        t = gj.Table.attach({table.name!r})
        print(t.rate_limiter, flush=True)
        assert sys.stdin.readline() == "go\\n"  # no insert before the test has seen the table too small
        for i in range(10):
            time.sleep(0.05)
            t.add({{"x": i}})
        t.close()
        """,
        stdin=True,
    )
    assert inserter.stdout.readline().strip() == repr(table.rate_limiter)
    assert not table.can_sample(1)  # attached, nothing inserted yet
    inserter.stdin.write("go\n")
    inserter.stdin.flush()
    table.await_samples(8, timeout=TIMEOUT)
    assert table.size >= 10 and table.can_sample(1)
    finish(inserter)
    assert table.rate_limiter_counts() == gj.RateLimiterCounts(inserts=10, samples=8, size=10, diff=None)


WRITER = """
import sys, numpy as np, gear_jax as gj
t = gj.Table.attach(sys.argv[1])
batch, base, n = int(sys.argv[2]), int(sys.argv[3]), 0
print("attached", flush=True)
try:
    while True:  # until the creator closes the table (a wait then raises TableClosedError)
        t.insert({"x": np.arange(base + n, base + n + batch, dtype=np.int32)}, timeout=60)
        n += batch
except gj.TableClosedError:
    print(n, flush=True)
"""


@pytest.mark.multiprocess
def test_two_writer_processes_and_a_learner_keep_the_ratio(make_table):
    """Two processes insert batches of 4 as fast as they can; a learner (this process) calls
    await_samples(16) before each jitted sample. Every snapshot of the counts, taken by another thread
    throughout, stays within [min_diff, max_diff] (min_diff from the first sample on), and the final
    ratio is the target within the tolerance."""
    spi, insert_batch, learner_batch = 2.0, 4, 16
    settings = gj.RateLimiter(
        min_size_to_sample=32, samples_per_insert=spi, error_buffer=(learner_batch + insert_batch * spi) / 2
    )
    table = make_table(fields=FIELDS, capacity=512, rate_limiter=settings)
    writers = [start_python(WRITER, table.name, str(insert_batch), str(k * 1_000_000)) for k in range(2)]
    assert [w.stdout.readline().strip() for w in writers] == ["attached"] * 2  # both before the learner
    step = jax.jit(lambda k: table.sample(k, learner_batch).indices)
    snapshots = []
    done = threading.Event()

    def watch():
        while not done.is_set():
            snapshots.append(table.rate_limiter_counts())
            time.sleep(0.0005)

    watcher = threading.Thread(target=watch, daemon=True)
    steps = 150
    try:
        watcher.start()
        for i in range(steps):
            table.await_samples(learner_batch, timeout=TIMEOUT)
            snapshots.append(table.rate_limiter_counts())
            jax.block_until_ready(step(jax.random.key(i)))
    finally:
        done.set()
        watcher.join(TIMEOUT)
        final = table.rate_limiter_counts()
        table.close()  # ends the writers' waits
    written = [int(finish(w)) for w in writers]
    assert final.samples == steps * learner_batch
    assert sum(written) >= final.inserts  # every admitted row was written (some more after `final`)
    assert all(n > 0 for n in written), written  # both writers took part
    assert len(snapshots) > steps
    for c in snapshots:
        assert c.diff <= settings.max_diff, c
        assert c.samples == 0 or c.diff >= settings.min_diff, c
    assert settings.min_diff <= final.diff <= settings.max_diff
    ratio = final.samples / final.inserts
    tolerance = (settings.error_buffer + spi * settings.min_size_to_sample) / final.inserts
    assert abs(ratio - spi) <= tolerance + 1e-9, (ratio, tolerance, final)
    print(f"{len(snapshots)} snapshots, final {final}, ratio {ratio:.3f} (target {spi}), writers {written}")
