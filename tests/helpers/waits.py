"""Waiting for what another thread or process does, instead of sleeping and assuming it happened."""

import sys
import threading
import time


def wait_until(condition, timeout, what):
    """Polls `condition()` every millisecond until it is true; fails naming `what` after `timeout` s."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"still waiting for {what} after {timeout} s")
        time.sleep(0.001)


# A profile function (sys.setprofile) sees a native method's name when the calling thread enters it
# ("c_call"). A native call that blocks (a rate limiter's wait, say) has started once its name was seen:
# from then on only native code runs until it returns. SIGNAL_NATIVE_CALL is the same function as code for
# another process, which prints a line instead: `signal_native_call(names, line)`.
SIGNAL_NATIVE_CALL = '''
import sys as _sys


def signal_native_call(names, line):
    def profile(frame, event, arg):
        if event == "c_call" and getattr(arg, "__name__", None) in names:
            _sys.setprofile(None)
            print(line, flush=True)

    _sys.setprofile(profile)
'''


def set_on_native_call(names, entered: threading.Event) -> None:
    """Sets `entered` when this thread next enters a native method named in `names` (once)."""

    def profile(frame, event, arg):
        if event == "c_call" and getattr(arg, "__name__", None) in names:
            sys.setprofile(None)
            entered.set()

    sys.setprofile(profile)
