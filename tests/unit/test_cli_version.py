"""`hpnlab --version` names the release and the commit; `hpnlab completion` completes commands and flags."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from support.paths import REPO

HPNLAB = str(Path(sys.executable).with_name("hpnlab"))


def test_version_names_the_release_and_the_checkouts_commit():
    head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short=12", "HEAD"], capture_output=True,
                          text=True, check=True).stdout.strip()
    r = subprocess.run([HPNLAB, "--version"], capture_output=True, text=True, timeout=30)
    assert r.returncode == 0
    assert r.stdout.startswith("hpnlab 0.") and f"commit {head}" in r.stdout


def complete(line: str) -> list[str]:
    """What the shell would offer for ``line``: argcomplete answers on file descriptor 8, as the
    shell code of `hpnlab completion bash` has it read."""
    env = dict(os.environ, _ARGCOMPLETE="1", COMP_LINE=line, COMP_POINT=str(len(line)), _ARGCOMPLETE_IFS="\n")
    r = subprocess.run(["bash", "-c", f"{HPNLAB} 8>&1 9>/dev/null"], env=env, capture_output=True, text=True,
                       timeout=60, stdin=subprocess.DEVNULL)
    return [w.strip() for w in r.stdout.split("\n") if w.strip()]


@pytest.mark.parametrize("line, expected", [("hpnlab to", "topo"), ("hpnlab model --ro", "--routing"),
                                            ("hpnlab completion ", "bash")])
def test_completion_offers_commands_and_their_flags(line, expected):
    assert expected in complete(line)


def test_completion_code_is_printed_for_bash_and_an_unknown_shell_is_one_line():
    bash = subprocess.run([HPNLAB, "completion", "bash"], capture_output=True, text=True, timeout=30)
    assert bash.returncode == 0 and "hpnlab" in bash.stdout and "complete" in bash.stdout
    bad = subprocess.run([HPNLAB, "completion", "nosh"], capture_output=True, text=True, timeout=30)
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1
