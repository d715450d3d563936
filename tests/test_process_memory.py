"""decoding/process_memory.py: the allocator setting is applied once per process and can be turned off."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

_PROBE = ("from dpledger.decoding.process_memory import retain_freed_memory; "
          "print(retain_freed_memory(), retain_freed_memory())")


def _probe(**env: str) -> str:
    done = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True, timeout=120,
                          env={**os.environ, **env})
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_turned_off_by_the_environment():
    assert _probe(DPLEDGER_RETAIN_FREED_MEMORY="0") == "False False"


@pytest.mark.skipif(not sys.platform.startswith("linux") or not os.confstr("CS_GNU_LIBC_VERSION"),
                    reason="mallopt is glibc's")
def test_applied_once_on_glibc():
    assert _probe(DPLEDGER_RETAIN_FREED_MEMORY="1") == "True True"

