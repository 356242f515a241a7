"""A child in a session of its own keeps its starter's CPU priority (``aurora_store.testing.children``).

With autogroups, each session is a CPU group of its own and ``nice`` acts only inside a group: without the
rule, a child that a lowered process (a background test worker) starts would compete at full weight with the
foreground. Checked through both ways the suite starts processes: :func:`children.popen` and the fork server.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(not Path("/proc/self/autogroup").exists(),
                                reason="this kernel has no autogroups: sessions share one CPU group")

# Started at a chosen nice, reports the nice of the sessions its two kinds of children lead.
_STARTER = textwrap.dedent("""
    import json, os, sys, tempfile
    from aurora_store.testing import children
    from workers import forkserver

    def group_nice(pid):
        with open(f"/proc/{pid}/autogroup") as f:  # "/autogroup-N nice K"
            return int(f.read().split()[-1])

    sleeper = children.popen([sys.executable, "-c", "import time; time.sleep(60)"])
    server = forkserver.ForkServer()
    log = os.path.join(tempfile.mkdtemp(), "relay.log")
    # a relay without Redis keeps retrying: alive long enough to be read
    relay = server.start("workers.relay", ["--bucket", "file:///nonexistent/b", "--redis", "redis://127.0.0.1:1",
                                           "--region", "r", "--source-bucket", "file:///nonexistent/a"],
                         env=dict(os.environ), log_path=log)
    try:
        print(json.dumps({"popen": group_nice(sleeper.pid), "forked": group_nice(relay.pid)}))
    finally:
        relay.kill(); relay.wait(30); sleeper.kill(); sleeper.wait(); server.close()
""")


def _session_nices(nice: int) -> dict[str, int]:
    out = subprocess.run([sys.executable, "-c", _STARTER], cwd=REPO, capture_output=True, text=True, timeout=120,
                         preexec_fn=lambda: os.setpriority(os.PRIO_PROCESS, 0, nice), check=False)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_a_lowered_starters_children_lead_sessions_at_its_nice():
    assert _session_nices(19) == {"popen": 19, "forked": 19}
    assert _session_nices(7) == {"popen": 7, "forked": 7}


@pytest.mark.skipif(os.geteuid() != 0 and os.getpriority(os.PRIO_PROCESS, 0) > 0,
                    reason="a lowered process that is not root cannot start one at nice 0")
def test_a_starter_at_the_default_priority_leaves_its_childrens_sessions_alone():
    assert _session_nices(0) == {"popen": 0, "forked": 0}
