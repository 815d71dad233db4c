"""Waiting for what another thread or process does, instead of sleeping and assuming it happened."""

import inspect
import time


def wait_until(condition, timeout, what):
    """Polls `condition()` every millisecond until it is true; fails naming `what` after `timeout` s."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"still waiting for {what} after {timeout} s")
        time.sleep(0.001)


def on_native_call(names, then):
    """Calls `then()` once, as this thread enters a native method (a pybind11 function of
    gear_jax._native) named in `names`.

    A profile function (sys.setprofile) sees each call of a C function as the thread enters it. A native
    call that blocks (a rate limiter's wait, say) has started once it was seen: from then on only native
    code runs in this thread until it returns or raises."""
    import sys

    def profile(frame, event, arg):
        native = type(getattr(arg, "__self__", None)).__name__.startswith("pybind11")
        if event == "c_call" and native and arg.__name__ in names:
            sys.setprofile(None)
            then()

    sys.setprofile(profile)


# on_native_call as code for another process (`python -c`): prepend it to the process's code.
ON_NATIVE_CALL = inspect.getsource(on_native_call)
