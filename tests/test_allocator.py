"""glibc's allocator as the CLI sets it (pipeline/ops/env.py): big buffers freed and allocated
again are not faulted in page by page each time, in this process and in those it starts."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from pipeline.ops.env import TUNABLES

# 40 rounds of a 64 MB buffer written and freed, as a pretraining step's logits are: the minor
# page faults that cost (a fresh mapping faults its 16,384 pages in again every round). malloc
# itself, through ctypes: numpy and torch may ask for huge pages, which fault 512 times less.
ROUNDS = """
import ctypes, resource, sys
if sys.argv[1] == "configure":
    from pipeline.ops import env
    env.configure()
libc, size = ctypes.CDLL("libc.so.6"), 64 << 20
libc.malloc.restype, libc.free.argtypes = ctypes.c_void_p, [ctypes.c_void_p]
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(40):
    buffer = libc.malloc(size)
    ctypes.memset(buffer, 1, size)
    libc.free(buffer)
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def _faults(how: str, tunables: str | None = None) -> int:
    env = {k: v for k, v in os.environ.items() if k != "GLIBC_TUNABLES"}
    if tunables is not None:
        env["GLIBC_TUNABLES"] = tunables
    done = subprocess.run([sys.executable, "-c", ROUNDS, how], env=env, capture_output=True, text=True,
                          check=True)
    return int(done.stdout)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's allocator")
def test_big_buffers_stay_in_the_process_that_configured_and_in_those_it_starts():
    default = _faults("plain")
    assert default > 40 * 16_000  # every round faulted all its pages in again
    assert _faults("configure") < default / 10  # mallopt, in this process
    assert _faults("plain", TUNABLES) < default / 10  # the variable, which children inherit
    assert _faults("configure", "glibc.malloc.check=0") > default / 2  # a user's own tunables stand
