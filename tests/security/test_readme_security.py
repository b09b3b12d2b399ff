"""The README's "Securing a cluster" walk-through, executed as written (one bash script).

The one change: port 9093 becomes a free port, so the test never collides with a running server.
Every command must succeed (set -e), and what the section promises must be seen: alice's message
comes back through her group, and her attempt to delete the topic is refused naming her.
"""

from __future__ import annotations

import os
import pathlib
import re
import socket
import subprocess
import sys

import pytest

README = pathlib.Path(__file__).resolve().parents[2] / "README.md"
pytestmark = pytest.mark.timeout(120)


def _section_script(text: str) -> str:
    match = re.search(r"^## Securing a cluster.*?$(.*?)(?=^## )", text, re.M | re.S)
    assert match, "README.md has no '## Securing a cluster' section"
    (block,) = re.findall(r"^```sh\n(.*?)^```", match.group(1), re.M | re.S)
    return block


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_the_securing_a_cluster_section_runs(tmp_path: pathlib.Path) -> None:
    script = _section_script(README.read_text()).replace("9093", str(_free_port()))
    env = {k: v for k, v in os.environ.items() if not k.startswith("DMQ_")}
    env["PATH"] = str(pathlib.Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")
    proc = subprocess.run(["bash", "-e", "-o", "pipefail", "-c", script], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=100)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "paid" in proc.stdout
    assert "refused, as it should be" in proc.stdout
    assert "principal 'alice' may not delete topic 'payments'" in proc.stderr
    assert (tmp_path / "certs" / "ca.pem").exists()
