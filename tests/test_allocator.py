"""runtime.launch.allocator: a rank keeps freed memory, so re-allocating the same sizes does not page-fault."""

import subprocess
import sys

import pytest

from workbench.runtime.launch.allocator import retain_freed_memory

# allocate and free 8 x 1 MiB twenty times; print the minor page faults of the last 20 rounds
PROBE = """
import resource, sys, torch
from workbench.runtime.launch.allocator import retain_freed_memory
print(retain_freed_memory())
faults = lambda: resource.getrusage(resource.RUSAGE_SELF).ru_minflt
def rounds():
    for _ in range(20):
        ts = [torch.ones(1 << 18) for _ in range(8)]
        del ts
rounds()  # the first round maps the heap
f0 = faults()
rounds()
print(faults() - f0)
"""


def _probe(env_value: str) -> tuple[str, int]:
    import os

    env = dict(os.environ, WORKBENCH_MALLOC=env_value)
    out = subprocess.run(
        [sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=120, check=True
    )
    took, faults = out.stdout.split()
    return took, int(faults)


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc malloc settings")
def test_retained_memory_is_reused_without_page_faults():
    took, faults = _probe("1")
    if took != "True":
        pytest.skip("not glibc: the settings do not apply")
    assert faults < 100  # 8 MiB re-used 20 times: no page touched anew
    # the control: glibc's defaults give the freed megabytes back, so the rounds fault again (in most
    # processes every page, 40k faults; in about one of six the heap's layout keeps them: up to 6 tries)
    for _ in range(6):
        off, default_faults = _probe("0")
        assert off == "False"
        if default_faults > 20 * 8 * 128:
            break
    assert default_faults > 20 * 8 * 128


def test_turned_off_by_environment(monkeypatch):
    monkeypatch.setenv("WORKBENCH_MALLOC", "0")
    assert retain_freed_memory() is False
