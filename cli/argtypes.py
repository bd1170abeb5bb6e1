"""argparse types for paths a command writes: checked when the flags are read, so a name the
file system refuses (too long, a folder, a missing parent) is a one-line usage error before
anything runs, not an OSError after an hour of emulation."""
from __future__ import annotations

import argparse
import os
from pathlib import Path

from hpnlab.fabric.errors import short


def _check_name(path: Path, text: str) -> None:
    if not text or "\0" in text:
        raise argparse.ArgumentTypeError(f"not a path: {short(text)}")
    if len(os.fsencode(text)) >= 4096 or any(len(os.fsencode(part)) > 255 for part in path.parts):
        raise argparse.ArgumentTypeError(f"a name too long for the file system: {short(text, 40)}")


def output_file(text: str) -> str:
    """A file to write: its folder exists and it is not itself a folder."""
    path = Path(text)
    _check_name(path, text)
    if path.is_dir():
        raise argparse.ArgumentTypeError(f"{short(text)} is a folder; give a file name")
    if not path.absolute().parent.is_dir():
        raise argparse.ArgumentTypeError(f"folder {short(str(path.parent))} does not exist")
    return text


def output_dir(text: str) -> str:
    """A folder to write into (made if missing): not an existing file."""
    path = Path(text)
    _check_name(path, text)
    if path.exists() and not path.is_dir():
        raise argparse.ArgumentTypeError(f"{short(text)} is a file, not a folder")
    return text
