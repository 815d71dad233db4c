"""gear_jax.host: the CPU kernels called on numpy arrays outside jit, checked against the custom calls
(same key, same picks and bytes), statistically, under concurrent writers, and on bad input."""

import os
import threading
import time
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

import gear_jax as gj
from tests.helpers.processes import start_uniform_writers
from tests.helpers.sampling import P_THRESHOLD, assert_prioritized, prioritized_table
from tests.helpers.tables import transitions

CPU = jax.devices("cpu")[0]


def _on_cpu(fn, *args):
    with jax.default_device(CPU):
        return jax.tree.map(np.asarray, jax.jit(fn)(*args))


def _assert_same_sample(a, b):
    for name in ("indices", "generations", "probabilities", "starts", "selectable"):
        np.testing.assert_array_equal(
            np.asarray(getattr(a, name)), np.asarray(getattr(b, name)), err_msg=name
        )
    assert a.window == b.window and a.table_handle == b.table_handle


def _child_succeeds(check, timeout_s, hung):
    """Forks; the child exits 0 only if `check()` returns True (any exception: 1). Returns whether it
    did; a child still running after `timeout_s` seconds is killed and the test fails with `hung`."""
    pid = os.fork()
    if pid == 0:
        try:
            ok = bool(check())
        except BaseException:  # noqa: BLE001 - any failure is the child's exit status
            ok = False
        os._exit(0 if ok else 1)
    deadline = time.monotonic() + timeout_s
    while not (done := os.waitpid(pid, os.WNOHANG))[0]:
        if time.monotonic() > deadline:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
            pytest.fail(hung)
        time.sleep(0.01)
    return os.WIFEXITED(done[1]) and os.WEXITSTATUS(done[1]) == 0


def _children_succeed_during(call, check, children, hung):
    """Calls `call()` over and over on a thread of this process while it forks `children` children in
    turn (once the thread finished its first call), each running `check` as `_child_succeeds` does;
    returns their results once the thread stopped."""
    stop, looping = threading.Event(), threading.Event()

    def loop():
        while not stop.is_set():
            call()
            looping.set()

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    try:
        assert looping.wait(60), "the calling thread did not finish its first call"
        return [_child_succeeds(check, 20, hung) for _ in range(children)]
    finally:
        stop.set()
        thread.join(timeout=30)


@pytest.mark.parametrize("method", ["uniform", "prioritized", "fifo", "lifo", "topk"])
def test_a_key_picks_what_the_custom_call_picks(make_table, method):
    table, _ = prioritized_table(make_table)
    for seed in range(5):
        key = jax.random.key(seed)
        kwargs = {"method": method, "priority_exponent": 0.7 if method == "prioritized" else 1.0}
        on_host = gj.host.sample(table, key, 8, **kwargs)
        jitted = _on_cpu(lambda k: gj.sample(table, k, 8, **kwargs), key)
        _assert_same_sample(on_host, jitted)
        s, batch = gj.host.sample_gather(table, key, 8, **kwargs)
        js, jbatch = _on_cpu(lambda k: gj.sample_gather(table, k, 8, **kwargs), key)
        _assert_same_sample(s, js)
        assert batch.keys() == jbatch.keys()
        for name in batch:
            assert batch[name].dtype == jbatch[name].dtype
            np.testing.assert_array_equal(batch[name], jbatch[name], err_msg=name)
        assert isinstance(batch["obs"], np.ndarray) and isinstance(s.indices, np.ndarray)


def test_windows_of_trajectories_match_the_custom_call(make_table):
    fields = {"obs": gj.Field((2,), "float32"), "reward": gj.Field((), "float32")}
    table = make_table(fields, capacity=8, max_steps=6)
    rng = np.random.default_rng(0)
    lengths = np.array([6, 3, 5, 1, 6], np.int32)
    table.insert(
        {
            "obs": rng.normal(size=(5, 6, 2)).astype(np.float32),
            "reward": rng.normal(size=(5, 6)).astype(np.float32),
        },
        lengths=lengths,
    )
    key = jax.random.key(3)
    s, batch = gj.host.sample_gather(table, key, 16, fields=["reward"], window=4)
    js, jbatch = _on_cpu(lambda k: gj.sample_gather(table, k, 16, fields=["reward"], window=4), key)
    _assert_same_sample(s, js)
    assert set(batch) == {"reward", "valid"} and batch["reward"].shape == (16, 4)
    np.testing.assert_array_equal(batch["reward"], jbatch["reward"])
    np.testing.assert_array_equal(batch["valid"], jbatch["valid"])
    # A gather of the same sample with another window, against the custom call's.
    again = gj.host.gather(table, s, window=2)
    jagain = _on_cpu(lambda smp: gj.gather(table, smp, window=2), js)
    for name in ("obs", "reward", "valid"):
        np.testing.assert_array_equal(again[name], jagain[name], err_msg=name)
    assert again["obs"].shape == (16, 2, 2)


def test_uniform_picks_with_a_numpy_generator_are_uniform(make_table):
    table = make_table(capacity=64)
    table.insert(transitions(50))
    rng = np.random.default_rng(11)
    counts = np.zeros(64, np.int64)
    for _ in range(40):
        s, batch = gj.host.sample_gather(table, rng, 1_000)
        counts += np.bincount(s.indices, minlength=64)
        # Every gathered row is the row picked: transitions() writes the row id into "action".
        np.testing.assert_array_equal(batch["action"], s.indices)
        assert batch["valid"].all()
    assert counts[50:].sum() == 0
    assert stats.chisquare(counts[:50]).pvalue > P_THRESHOLD
    np.testing.assert_allclose(s.probabilities, 1 / 50)
    assert int(s.selectable) == 50


def test_prioritized_picks_follow_the_priorities(make_table):
    table, priorities = prioritized_table(make_table)
    rng = np.random.default_rng(5)
    counts = np.zeros(32, np.int64)
    for _ in range(20):
        s = gj.host.sample(table, rng, 2_000, method="prioritized", priority_exponent=0.6)
        counts += np.bincount(s.indices, minlength=32)
    assert_prioritized(counts, s, priorities, 0.6)


def test_generator_advances_one_draw_per_call(make_table):
    table = make_table()
    table.insert(transitions(10))
    a = gj.host.sample(table, np.random.default_rng(1), 16)
    rng = np.random.default_rng(1)
    b = gj.host.sample(table, rng, 16)
    c = gj.host.sample(table, rng, 16)
    np.testing.assert_array_equal(a.indices, b.indices)
    assert not np.array_equal(b.indices, c.indices)


def test_update_priorities_changes_the_distribution_and_skips_overwritten_rows(make_table):
    table = make_table(capacity=8)
    table.insert(transitions(8))
    rng = np.random.default_rng(0)
    s = gj.host.sample(table, rng, 8, method="fifo")
    np.testing.assert_array_equal(np.sort(s.indices), np.arange(8))
    new = np.where(s.indices == 3, 5.0, 0.0).astype(np.float32)
    assert gj.host.update_priorities(table, s, new) == 8
    # Only row 3 keeps a priority above 0: it is the only selectable row.
    picks = gj.host.sample(table, rng, 200, method="prioritized")
    assert set(picks.indices.tolist()) == {3} and int(picks.selectable) == 1
    assert table.row_status()["priority"][3] == 5.0
    # Row 3 overwritten (the ring wraps to it after 8 more inserts... the oldest first): its old
    # generation no longer matches, so the update skips it and the gather returns it invalid.
    table.insert(transitions(8, start=100))
    assert gj.host.update_priorities(table, s, np.ones(8, np.float32)) == 0
    batch = gj.host.gather(table, s)
    assert not batch["valid"].any() and not batch["obs"].any()


def test_results_go_into_the_arrays_given_as_out(make_table):
    table = make_table()
    table.insert(transitions(10))
    out = {"obs": np.full((4, 3), np.nan, np.float32), "valid": np.zeros(4, bool)}
    s, batch = gj.host.sample_gather(table, np.random.default_rng(2), 4, out=out)
    assert batch["obs"] is out["obs"] and batch["valid"] is out["valid"]
    np.testing.assert_array_equal(out["obs"][:, 0], s.indices.astype(np.float32))
    assert out["valid"].all()
    assert batch["action"].shape == (4,)  # not given: allocated


def test_out_arrays_that_overlap_each_other_or_the_table_are_refused_before_anything_is_written(make_table):
    table = make_table()
    table.insert(transitions(10))
    s = gj.host.sample(table, np.random.default_rng(0), 4, method="fifo")
    shared = np.zeros(4 * 3 + 4, np.float32)
    status = table.row_status()
    state = table.status_columns["state"]
    cases = [
        (
            {"obs": shared[:12].reshape(4, 3), "valid": shared[11:15].view(np.bool_)[:4]},
            r"out\['obs'\] overlaps out\['valid'\]",
        ),
        ({"valid": state.view(np.bool_)[:4]}, r"out\['valid'\] overlaps the memory of table"),
        ({"obs": state[:6].view(np.float32).reshape(4, 3)}, r"out\['obs'\] overlaps the memory of table"),
    ]
    for out, message in cases:
        for call in (
            lambda: gj.host.gather(table, s, out=out),
            lambda: gj.host.sample_gather(table, np.random.default_rng(0), 4, out=out),
        ):
            with pytest.raises(gj.InvalidArgumentError, match=message):
                call()
    after = table.row_status()
    assert all(np.array_equal(status[k], after[k]) for k in status)
    np.testing.assert_array_equal(table.columns["obs"][:10, 0, 0], np.arange(10, dtype=np.float32))
    assert not shared.any()
    # Neighbours that only touch are fine.
    out = {"obs": shared[:12].reshape(4, 3), "valid": shared[12:13].view(np.bool_)}
    assert gj.host.gather(table, s, out=out)["valid"].all()


def test_a_refused_out_array_is_told_which_requirement_it_fails(make_table):
    table = make_table()
    table.insert(transitions(10))
    s = gj.host.sample(table, np.random.default_rng(0), 4)
    read_only = np.zeros((4, 3), np.float32)
    read_only.flags.writeable = False
    fix = r"; give a writable C-contiguous numpy array of float32\[4, 3\], as np.empty\(\(4, 3\), 'float32'\)"
    cases = [
        ([[0.0] * 3] * 4, r"out\['obs'\] is a list, not a numpy array" + fix),
        (np.zeros((4, 4), np.float32), r"out\['obs'\] has shape \(4, 4\), expected \(4, 3\)" + fix),
        (np.zeros((4, 3), np.float64), r"out\['obs'\] has dtype float64, expected float32" + fix),
        (np.zeros((3, 4), np.float32).T, r"out\['obs'\] is not C-contiguous \(strides \(4, 16\)\)" + fix),
        (np.zeros((8, 3), np.float32)[::2], r"out\['obs'\] is not C-contiguous \(strides \(24, 4\)\)" + fix),
        (read_only, r"out\['obs'\] is read-only \(flags.writeable is False\)" + fix),
        (  # every failed requirement at once
            np.zeros((4, 4), np.float64)[:, :3],
            r"out\['obs'\] has dtype float64, expected float32, and is not C-contiguous",
        ),
    ]
    for given, message in cases:
        for call in (
            lambda: gj.host.gather(table, s, out={"obs": given}),
            lambda: gj.host.sample_gather(table, np.random.default_rng(0), 4, out={"obs": given}),
        ):
            with pytest.raises(gj.InvalidArgumentError, match=message):
                call()
    with pytest.raises(gj.InvalidArgumentError, match=r"out\['valid'\] has dtype int8, expected bool"):
        gj.host.gather(table, s, out={"valid": np.zeros(4, np.int8)})
    assert not read_only.any()


def test_a_jitted_sample_gathers_on_the_host_and_a_host_sample_updates_in_jit(make_table):
    table, _ = prioritized_table(make_table)
    js = _on_cpu(lambda k: gj.sample(table, k, 6), jax.random.key(0))
    batch = gj.host.gather(table, js)
    np.testing.assert_array_equal(batch["action"], js.indices)
    s = gj.host.sample(table, np.random.default_rng(0), 6, method="fifo")
    with jax.default_device(CPU):
        count = jax.jit(lambda smp, p: gj.update_priorities(table, smp, p))(s, jnp.full(6, 2.0))
    assert int(count) == 6
    assert (table.row_status()["priority"][s.indices] == 2.0).all()


def test_gathers_under_concurrent_writers_are_never_torn(make_table):
    """Writers in other processes rewrite rows with one value per row; a valid gathered row holds one
    value throughout, and invalid rows are zero."""
    width = 256
    table = make_table({"v": gj.Field((width,), "int32")}, capacity=16)
    table.insert({"v": np.zeros((16, width), np.int32)})
    writers = start_uniform_writers(table, width, seconds=3.0)
    rng = np.random.default_rng(0)
    valid_rows = invalid_rows = 0
    try:
        end = time.monotonic() + 2.5
        while time.monotonic() < end:
            _, batch = gj.host.sample_gather(table, rng, 64)
            v, ok = batch["v"], batch["valid"]
            assert (v[ok] == v[ok][:, :1]).all(), "a valid row mixes two writes"
            assert not v[~ok].any()
            valid_rows += int(ok.sum())
            invalid_rows += int((~ok).sum())
    finally:
        for w in writers:
            _, err = w.communicate(timeout=60)
            assert w.returncode == 0, err
    assert valid_rows > 1_000


def test_bad_arguments_are_refused_by_name(make_table):
    table = make_table()
    table.insert(transitions(4))
    rng = np.random.default_rng(0)
    s = gj.host.sample(table, rng, 4)
    cases = [
        (lambda: gj.host.sample(table, 7, 4), "rng must be a numpy.random.Generator"),
        (lambda: gj.host.sample(table, rng, 0), "batch_size=0"),
        (lambda: gj.host.sample(table, rng, 4, method="best"), "method='best'"),
        (lambda: gj.host.sample(table, rng, 4, priority_exponent=-1), "priority_exponent=-1"),
        (lambda: gj.host.sample(table, rng, 4, window=2), "window=2"),
        (lambda: gj.host.sample(object(), rng, 4), "`table` must be a gear_jax.Table"),
        (lambda: gj.host.gather(table, s, fields=["nope"]), "fields ['nope']"),
        (lambda: gj.host.gather(table, s, fields=3), "fields=3"),
        (lambda: gj.host.gather(table, "s"), "must be a gear_jax.Sample"),
        (
            lambda: gj.host.gather(table, s, out={"obs": np.zeros((4, 3), np.float64)}),
            "out['obs'] has dtype float64, expected float32",
        ),
        (lambda: gj.host.gather(table, s, out={"obs": np.zeros((3, 4), np.float32).T}), "C-contiguous"),
        (lambda: gj.host.gather(table, s, out={"bogus": np.zeros(4)}), "['bogus']"),
        (lambda: gj.host.update_priorities(table, s, np.ones(3)), "shape (3,)"),
        (lambda: gj.host.update_priorities(table, s, np.array(["a"] * 4)), "dtype <U1"),
        (lambda: gj.host.update_priorities(table, s, [1.0, np.nan, 1.0, 1.0]), "priorities[1] = nan"),
    ]
    for call, words in cases:
        with pytest.raises(gj.InvalidArgumentError) as info:
            call()
        assert words in str(info.value), (words, str(info.value))
    assert (table.row_status()["priority"][:4] == 1.0).all()  # the refused NaN update changed nothing


def test_options_that_cannot_take_effect_are_refused_or_warned_about(make_table):
    """short_episodes="skip" without a window is refused; a priority_exponent other than 1.0 with a method
    other than "prioritized" draws a UserWarning at the caller's line; defaults given explicitly pass."""
    table = make_table({"x": gj.Field((), "float32")}, capacity=8, max_steps=6)
    table.insert({"x": np.ones((3, 6), np.float32)}, lengths=[6, 1, 5])
    rng = np.random.default_rng(0)
    # Batch sizes of their own: the checks (and so the warning) run once per set of arguments.
    calls = {
        "gear_jax.host.sample": lambda **kw: gj.host.sample(table, rng, 3, **kw),
        "gear_jax.host.sample_gather": lambda **kw: gj.host.sample_gather(table, rng, 2, **kw),
        "gear_jax.host.Sampler": lambda **kw: gj.host.Sampler(table, 1, rng=0, **kw)(),
    }
    for op, call in calls.items():
        with pytest.raises(gj.InvalidArgumentError, match=rf"{op}: short_episodes='skip' needs a window"):
            call(short_episodes="skip")
        for method in ("uniform", "fifo", "lifo", "topk"):
            with pytest.warns(
                UserWarning, match=rf"{op}: priority_exponent=0.5 has no effect with method"
            ) as w:
                call(method=method, priority_exponent=0.5)
            assert [os.path.basename(r.filename) for r in w] == ["test_host.py"]  # the caller's line
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            call(short_episodes="pad", priority_exponent=1.0, method="fifo")  # defaults, spelled out
            call(short_episodes="skip", window=4)  # with a window: never picks the row of 1 step
            call(method="prioritized", priority_exponent=0.5)


def test_a_table_with_too_few_rows_raises_not_enough_rows(make_table):
    table = make_table()
    rng = np.random.default_rng(0)
    with pytest.raises(gj.NotEnoughRowsError, match="gear_jax.host.sample"):
        gj.host.sample_gather(table, rng, 4)
    table.insert(transitions(3))
    with pytest.raises(gj.NotEnoughRowsError):
        gj.host.sample(table, rng, 4, method="fifo")
    assert len(gj.host.sample(table, rng, 3, method="fifo").indices) == 3


def test_a_closed_table_raises_instead_of_reading_freed_memory(make_table):
    table = make_table()
    table.insert(transitions(4))
    rng = np.random.default_rng(0)
    s = gj.host.sample(table, rng, 4)
    table.close()
    for call in (
        lambda: gj.host.sample(table, rng, 4),
        lambda: gj.host.gather(table, s),
        lambda: gj.host.sample_gather(table, rng, 4),
        lambda: gj.host.update_priorities(table, s, np.ones(4)),
    ):
        with pytest.raises(gj.TableClosedError, match="is closed"):
            call()


def test_large_calls_shared_over_host_threads_match_the_custom_call(make_table):
    """256 picks of 4 KiB (1 MiB: ranges of 128 KiB over the host threads) and 4,096 prioritized picks
    (ranges of 256) give the jitted call's picks and bytes."""
    table = make_table({"x": gj.Field((1024,), "float32")}, capacity=512)
    rng = np.random.default_rng(0)
    table.insert({"x": rng.normal(size=(512, 1024)).astype(np.float32)}, priorities=rng.uniform(0.1, 2, 512))
    key = jax.random.key(9)
    for method, b in (("uniform", 256), ("prioritized", 4096)):
        s, batch = gj.host.sample_gather(table, key, b, method=method)
        js, jbatch = _on_cpu(lambda k, m=method, n=b: gj.sample_gather(table, k, n, method=m), key)
        _assert_same_sample(s, js)
        np.testing.assert_array_equal(batch["x"], jbatch["x"])
        assert batch["valid"].all()


@pytest.mark.filterwarnings("ignore:os.fork:RuntimeWarning")  # the child makes no JAX call
def test_a_forked_child_samples_with_its_own_threads(make_table):
    """The parent's host threads do not survive a fork; the child's first large call starts its own."""
    table = make_table({"x": gj.Field((1024,), "float32")}, capacity=512)
    table.insert({"x": np.arange(512 * 1024, dtype=np.float32).reshape(512, 1024)})
    gj.host.sample_gather(table, np.random.default_rng(0), 256)  # the parent's pool starts

    def large_call_reads_the_right_rows():
        s, batch = gj.host.sample_gather(table, np.random.default_rng(1), 256)
        return batch["valid"].all() and (batch["x"][:, 0] == s.indices * 1024.0).all()

    assert _child_succeeds(large_call_reads_the_right_rows, 60, "the forked child hung in a host call")


@pytest.mark.parametrize("method", ["uniform", "prioritized", "fifo", "topk"])
def test_a_sampler_draws_what_sample_gather_draws_with_the_same_generator(make_table, method):
    table, _ = prioritized_table(make_table)
    exponent = 0.7 if method == "prioritized" else 1.0
    sampler = gj.host.Sampler(table, 8, method=method, priority_exponent=exponent, rng=3)
    rng = np.random.default_rng(3)
    for _ in range(4):
        s, batch = sampler()
        expected_s, expected = gj.host.sample_gather(table, rng, 8, method=method, priority_exponent=exponent)
        _assert_same_sample(s, expected_s)
        assert batch.keys() == expected.keys()
        for name in batch:
            np.testing.assert_array_equal(batch[name], expected[name], err_msg=name)


def test_a_sampler_draws_windows_of_trajectories_as_the_custom_call(make_table):
    table = make_table({"obs": gj.Field((2,), "float32")}, capacity=8, max_steps=6)
    rng = np.random.default_rng(0)
    table.insert({"obs": rng.normal(size=(5, 6, 2)).astype(np.float32)}, lengths=[6, 3, 5, 1, 6])
    sampler = gj.host.Sampler(table, 16, fields=["obs"], window=4, rng=np.random.default_rng(8))
    s, batch = sampler()
    # gj.host.sample_gather, which the tests above tie to the custom call, with the same generator.
    expected_s, expected = gj.host.sample_gather(
        table, np.random.default_rng(8), 16, fields=["obs"], window=4
    )
    _assert_same_sample(s, expected_s)
    assert s.window == 4 and batch["obs"].shape == (16, 4, 2) and batch["valid"].shape == (16, 4)
    assert batch["valid"].sum() < 16 * 4  # rows of 3 and 1 steps pad their windows
    np.testing.assert_array_equal(batch["obs"], expected["obs"])
    np.testing.assert_array_equal(batch["valid"], expected["valid"])


@pytest.mark.parametrize("short_episodes", ["pad", "skip"])
def test_a_sampler_treats_short_episodes_as_sample_gather_does(make_table, short_episodes):
    table = make_table({"obs": gj.Field((2,), "float32")}, capacity=8, max_steps=6)
    rng = np.random.default_rng(0)
    table.insert({"obs": rng.normal(size=(5, 6, 2)).astype(np.float32)}, lengths=[6, 3, 5, 1, 6])
    rng = np.random.default_rng(5)
    sampler = gj.host.Sampler(table, 64, window=4, rng=rng, short_episodes=short_episodes)
    expected_rng = np.random.default_rng(5)
    for _ in range(3):
        s, batch = sampler()
        expected_s, expected = gj.host.sample_gather(
            table, expected_rng, 64, window=4, short_episodes=short_episodes
        )
        _assert_same_sample(s, expected_s)
        for name in ("obs", "valid"):
            np.testing.assert_array_equal(batch[name], expected[name], err_msg=name)
        short = np.isin(s.indices, [1, 3])  # rows of 3 and 1 steps: shorter than the window
        if short_episodes == "skip":
            assert not short.any() and batch["valid"].all()
        else:  # 64 picks of 5 rows, none of the 2 short ones: (3/5)**64, about 6e-15
            assert short.any() and not batch["valid"][short].all()
    for kwargs, match in (
        ({"short_episodes": "drop"}, "short_episodes='drop'"),
        ({"method": "prioritized", "short_episodes": "skip"}, 'short_episodes="skip" is not available'),
    ):
        with pytest.raises(gj.InvalidArgumentError, match=match):
            gj.host.Sampler(table, 4, window=4, **kwargs)


def test_a_sampler_reuses_its_buffers_in_turn(make_table):
    table = make_table(capacity=64)
    table.insert(transitions(64))
    sampler = gj.host.Sampler(table, 16, fields=["action"], rng=0, buffers=2)
    s1, b1 = sampler()
    kept = b1["action"].copy()
    np.testing.assert_array_equal(kept, s1.indices)
    s2, b2 = sampler()
    assert b2["action"] is not b1["action"]
    np.testing.assert_array_equal(b1["action"], kept)  # the other buffer: still the first batch
    s3, b3 = sampler()
    assert b3["action"] is b1["action"] and s3.indices is s1.indices  # the first buffer again
    np.testing.assert_array_equal(b3["action"], s3.indices)
    assert not np.array_equal(b3["action"], kept)  # overwritten (16 picks of 64: equal by chance ~1e-29)


def test_a_sampler_updates_the_priorities_of_its_last_draw(make_table):
    table = make_table(capacity=8)
    table.insert(transitions(8))
    sampler = gj.host.Sampler(table, 8, method="fifo", rng=0)
    with pytest.raises(gj.InvalidArgumentError, match="nothing drawn yet"):
        sampler.update_priorities(np.ones(8))
    s, _ = sampler()
    assert sampler.update_priorities(np.where(s.indices == 5, 2.0, 0.0)) == 8
    picks = gj.host.sample(table, np.random.default_rng(0), 100, method="prioritized")
    assert set(picks.indices.tolist()) == {5}


def test_a_sampler_refuses_bad_arguments_and_closed_tables(make_table):
    table = make_table()
    table.insert(transitions(10))
    for kwargs, match in (
        ({"buffers": 0}, "buffers=0"),
        ({"rng": "seed"}, "rng must be"),
        ({"method": "random"}, "method='random'"),
        ({"fields": ["nope"]}, "fields"),
        ({"window": 3}, "window"),
    ):
        with pytest.raises(gj.InvalidArgumentError, match=match):
            gj.host.Sampler(table, 4, **kwargs)
    with pytest.raises(gj.InvalidArgumentError, match="batch_size=0"):
        gj.host.Sampler(table, 0)
    sampler = gj.host.Sampler(table, 4, rng=0)
    sampler()
    table.close()
    with pytest.raises(gj.TableClosedError, match="closed"):
        sampler()
    with pytest.raises(gj.TableClosedError, match="closed"):
        gj.host.Sampler(table, 4)


@pytest.mark.filterwarnings("ignore:os.fork:RuntimeWarning")  # the children make no JAX call
def test_a_child_forked_during_a_prioritized_call_samples_without_hanging(make_table):
    """Another thread of the parent is inside prioritized calls (holding the priority index's lock,
    refreshing the index) when the parent forks: each child's own prioritized call must not wait on
    the copied lock, and must follow the priorities (an index rebuilt in the child, not a half-refreshed
    copy)."""
    rows = 1 << 18
    table = make_table({"x": gj.Field((), "float32")}, capacity=rows)
    priorities = np.zeros(rows, np.float32)
    priorities[:64] = 1.0  # only rows [0, 64) are selectable
    table.insert({"x": np.zeros(rows, np.float32)}, priorities=priorities)
    rng = np.random.default_rng(1)

    def call():
        s = gj.host.sample(table, rng, 4096, method="prioritized", priority_exponent=0.6)
        gj.host.update_priorities(table, s, np.ones(4096, np.float32))  # dirties the index again

    def picks_selectable_rows():
        s = gj.host.sample(table, np.random.default_rng(2), 256, method="prioritized")
        return (s.indices < 64).all() and int(s.selectable) == 64

    hung = "a child forked during a prioritized host call hung in its own call"
    results = _children_succeed_during(call, picks_selectable_rows, 12, hung)
    assert all(results), results


def test_priorities_as_bfloat16_and_as_torch_tensors_that_require_grad(make_table):
    torch = pytest.importorskip("torch")
    table = make_table(capacity=8)
    table.insert(transitions(8))
    s = gj.host.sample(table, np.random.default_rng(0), 8, method="fifo")
    assert gj.host.update_priorities(table, s, np.full(8, 2.0, jnp.bfloat16)) == 8
    assert (table.row_status()["priority"][:8] == 2.0).all()
    grad = torch.full((8,), 3.0, requires_grad=True)
    assert gj.host.update_priorities(table, s, grad * 1.0) == 8
    assert (table.row_status()["priority"][:8] == 3.0).all()


def test_an_mt19937_generator_fills_both_seed_words():
    words = gj.host._seed_words(np.random.Generator(np.random.MT19937(0)), "op")
    raw = np.random.MT19937(0).random_raw(2)
    assert words == (int(raw[1]), int(raw[0])) and words[1] != 0


def test_a_bad_rng_and_results_too_large_for_memory_are_refused_by_name(make_table, monkeypatch):
    table = make_table()
    table.insert(transitions(10))
    for rng in (np.random.PCG64(0), "seed", 1.5):
        with pytest.raises(gj.InvalidArgumentError, match="rng must be a numpy.random.Generator"):
            gj.host.sample(table, rng, 4)
    monkeypatch.setattr(gj._args, "host_memory_available", lambda: 1 << 20)
    with pytest.raises(gj.InvalidArgumentError, match="picks need .* GiB of results, more than"):
        gj.host.sample(table, np.random.default_rng(0), 100_000)
    # A gather's refusal names the call that was made, whose plan it came from.
    wide = make_table(fields={"obs": gj.Field((4096,), "float32")}, capacity=4)
    wide.insert({"obs": np.zeros((4, 4096), np.float32)})
    for op, call in [
        ("sample_gather", lambda: gj.host.sample_gather(wide, np.random.default_rng(0), 1000)),
        ("Sampler", lambda: gj.host.Sampler(wide, 1000)),
    ]:
        with pytest.raises(gj.InvalidArgumentError, match=rf"^gear_jax.host.{op}: 1000 picks .* of results"):
            call()


def test_a_native_call_on_a_closed_table_raises_table_closed(make_table):
    table = make_table()
    table.insert(transitions(4))
    native = table.native
    table.close()
    with pytest.raises(gj.TableClosedError, match="is closed"):
        native.host_sample(1, 2, 4, 0, 1.0, 0, [], 0, [])


@pytest.mark.filterwarnings("ignore:os.fork:RuntimeWarning")  # the child makes no JAX call
def test_a_child_forked_during_a_sampler_draw_can_draw_with_it(make_table):
    """The parent's thread is inside a draw of the sampler when the parent forks: the child's copy of
    the sampler must not take the copied in-use mark for a thread of its own."""
    table = make_table({"x": gj.Field((256,), "float32")}, capacity=4096)
    table.insert({"x": np.zeros((4096, 256), np.float32)})
    sampler = gj.host.Sampler(table, 2048, rng=0)
    hung = "a forked child hung drawing with the sampler"
    results = _children_succeed_during(sampler, lambda: sampler()[1]["valid"].all(), 8, hung)
    assert all(results), results


def test_host_calls_take_numpy_keys_and_torch_bfloat16_priorities(make_table):
    torch = pytest.importorskip("torch")
    table = make_table(capacity=8)
    table.insert(transitions(8))
    key = jax.random.PRNGKey(4)
    np.testing.assert_array_equal(
        gj.host.sample(table, np.asarray(key), 8).indices, gj.host.sample(table, key, 8).indices
    )
    s = gj.host.sample(table, np.random.default_rng(0), 8, method="fifo")
    assert gj.host.update_priorities(table, s, torch.full((8,), 1.5, dtype=torch.bfloat16)) == 8
    assert (table.row_status()["priority"][:8] == 1.5).all()
    with pytest.raises(gj.InvalidArgumentError, match="rng=-1 must be a seed >= 0"):
        gj.host.Sampler(table, 4, rng=-1)
