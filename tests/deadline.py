"""One deadline for in-process calls that could block (a FIFO, /dev/zero, a lock held by a dead
writer): SIGALRM raises `Hang`, a BaseException, so that no `except Exception`, `except OSError` or the
CLI's own handlers can turn a hang into an answer (a TimeoutError would come back as a one-line
refusal with exit 2 and pass a test that should fail)."""
from __future__ import annotations

import signal
from collections.abc import Iterator
from contextlib import contextmanager


class Hang(BaseException):
    """A call still running at its deadline."""


@contextmanager
def deadline(seconds: int) -> Iterator[None]:
    """Run the body under an alarm of `seconds`; raise `Hang` if it is still running then."""
    def expire(signum, frame):
        raise Hang(f"still running after {seconds} s: it blocks")
    previous = signal.signal(signal.SIGALRM, expire)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
