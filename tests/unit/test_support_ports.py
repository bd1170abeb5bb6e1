"""The port blocks the transports' tests bind (tests/support/ports.py)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from support.ports import port_block

SUPPORT = Path(__file__).resolve().parents[1]


def test_a_block_held_by_one_process_is_not_handed_to_another(tmp_path):
    mine = port_block(40000, 10, 3, tmp_path)
    script = ("import sys; from pathlib import Path; sys.path.insert(0, sys.argv[1]); "
              "from support.ports import port_block; print(port_block(40000, 10, 3, Path(sys.argv[2])))")
    other = subprocess.run([sys.executable, "-c", script, str(SUPPORT), str(tmp_path)],
                           capture_output=True, text=True, check=True, timeout=60)
    assert int(other.stdout) != mine
    assert int(other.stdout) in {40000, 40010, 40020}


def test_blocks_are_handed_out_until_none_is_left(tmp_path):
    assert {port_block(41000, 5, 2, tmp_path), port_block(41000, 5, 2, tmp_path)} == {41000, 41005}
    with pytest.raises(RuntimeError, match="held by another test process"):
        port_block(41000, 5, 2, tmp_path)
