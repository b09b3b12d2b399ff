"""Run a README section's ```python examples as written, against a test's server.

The section's python blocks are joined into one script, the README's address is replaced by the
server's, and the script runs in a child process with no logging configured. The caller checks
what it printed; an example that fails, or writes anything on stderr, fails here.
"""

from __future__ import annotations

import pathlib
import re
import subprocess
import sys

README = pathlib.Path(__file__).resolve().parents[1] / "README.md"
README_ADDRESS = "127.0.0.1:9091"


def section_blocks(title: str) -> list[str]:
    """The ```python blocks of the README section `## title`."""
    match = re.search(rf"^## {re.escape(title)}$(.*?)(?=^## )", README.read_text(), re.M | re.S)
    assert match, f"README.md has no '## {title}' section"
    return re.findall(r"^```python\n(.*?)^```", match.group(1), re.M | re.S)


def section_script(title: str) -> str:
    blocks = section_blocks(title)
    assert blocks, f"README.md's '## {title}' has no python example"
    assert README_ADDRESS in "".join(blocks), f"the '## {title}' examples do not use {README_ADDRESS}"
    return "\n".join(blocks)


def run_section(title: str, bootstrap: str) -> list[str]:
    """The lines the section's examples print, run against `bootstrap`."""
    script = section_script(title)
    done = subprocess.run(
        [sys.executable, "-c", script.replace(README_ADDRESS, bootstrap)],
        capture_output=True, text=True, timeout=90, check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stderr == "", done.stderr
    return done.stdout.splitlines()
