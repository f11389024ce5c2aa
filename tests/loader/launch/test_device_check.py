"""install()'s architecture check reaches the launcher however late it is made (loader/launch/cuda_launch.py).

install() no longer makes the launcher (loading the C extension): it hands the check to `set_device_check`, which
puts it on the launcher if one exists and keeps it for the one the first load makes. Each test runs in a child (its
own launcher). The control: a launcher made the old way, after install() without the hand-over, has no check.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

CHILD = r"""
import json, sys
from nojit.loader.launch import cuda_launch
case = sys.argv[1]
seen = []
if case == "before":  # a launcher already there (made by a tool, or the dry-run launcher of the tests)
    made = cuda_launch.launcher()
    cuda_launch.set_device_check(seen.append)
elif case == "after":  # install() first, the first module load makes the launcher later
    cuda_launch.set_device_check(seen.append)
    made = cuda_launch.launcher()
else:  # control: no hand-over, a launcher made later has no check
    made = cuda_launch.launcher()
if made.device_check is not None:
    made.device_check(3)
print(json.dumps({"seen": seen, "same": cuda_launch.launcher() is made}))
"""


def _run(case: str) -> dict:
    p = subprocess.run([sys.executable, "-c", CHILD, case], capture_output=True, text=True, timeout=120)
    if p.returncode != 0 and "_cuda_launcher" in p.stderr:
        pytest.skip("the C launcher extension is not built")
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("case", ["before", "after"])
def test_the_device_check_reaches_the_launcher_made_before_or_after_install(case):
    assert _run(case) == {"seen": [3], "same": True}


def test_control_a_launcher_made_without_the_hand_over_has_no_check():
    assert _run("control") == {"seen": [], "same": True}
