"""The second machine's link (tools/scripts/kernel_lane/common.sh, ``lane_hold_link``): one run at
a time, and a tap that a killed run left behind does not fail the next run (root: tap devices)."""
from __future__ import annotations

import fcntl
import os
import subprocess
from pathlib import Path

import pytest
from support.paths import SCRIPTS

COMMON = SCRIPTS / "kernel_lane" / "common.sh"


def _hold_link(tap: str, lock: Path, wait_s: int, run_prefix: Path) -> subprocess.CompletedProcess[str]:
    script = f'source "{COMMON}"; lane_hold_link "$1" "$2" "$3"'
    return subprocess.run(["bash", "-c", script, "lane", tap, str(lock), str(wait_s)],
                          capture_output=True, text=True, timeout=60,
                          env={**os.environ, "LANE_RUN_PREFIX": f"{run_prefix}/run."})


@pytest.fixture
def tap():
    name = f"hpnlab-smt{os.getpid() % 10000}"
    subprocess.run(["ip", "tuntap", "add", "dev", name, "mode", "tap"], check=True)
    yield name
    if Path(f"/sys/class/net/{name}").exists():
        subprocess.run(["ip", "link", "del", name], check=True)


@pytest.mark.emulation
def test_a_tap_left_by_a_killed_run_is_removed_once_no_run_holds_the_lock(tap, tmp_path):
    done = _hold_link(tap, tmp_path / "lock", 5, tmp_path)
    assert done.returncode == 0, done.stderr
    assert f"removing {tap}, left by a run that was killed" in done.stdout
    assert not Path(f"/sys/class/net/{tap}").exists()


@pytest.mark.emulation
def test_while_another_run_holds_the_lock_the_next_waits_and_leaves_its_tap_alone(tap, tmp_path):
    lock = tmp_path / "lock"
    with lock.open("w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        held.write(f"{os.getpid()}\n")
        held.flush()
        done = _hold_link(tap, lock, 1, tmp_path)
    assert done.returncode == 1
    assert f"another run holds {lock} (pid {os.getpid()})" in done.stdout
    assert f"still holds {lock} after 1s" in done.stderr
    assert Path(f"/sys/class/net/{tap}").exists()


@pytest.mark.emulation
def test_the_run_directories_of_killed_runs_are_pruned_to_the_newest_three(tap, tmp_path):
    made = []
    for i in range(5):
        d = tmp_path / f"run.{i}"
        d.mkdir()
        os.utime(d, (1_000_000 + i, 1_000_000 + i))
        made.append(d)
    done = _hold_link(tap, tmp_path / "lock", 5, tmp_path)
    assert done.returncode == 0, done.stderr
    assert [d.exists() for d in made] == [False, False, True, True, True]
