"""Print the project's Python requirements (install_requires plus every extra), one a line.

Read from setup.cfg with the standard library only, so the host can run it before any
venv exists. The full-kernel lane installs exactly these into the guest image and hashes
them into the image key, so a change to setup.cfg rebuilds the image.
"""
from __future__ import annotations

import configparser
import sys
from pathlib import Path


def requirements(setup_cfg: Path) -> list[str]:
    cfg = configparser.ConfigParser()
    cfg.read(setup_cfg)
    reqs = cfg.get("options", "install_requires", fallback="").split("\n")
    if cfg.has_section("options.extras_require"):
        for _extra, value in cfg.items("options.extras_require"):
            reqs += value.split("\n")
    return sorted({r.strip() for r in reqs if r.strip() and not r.strip().startswith("#")})


if __name__ == "__main__":
    path = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parents[2] / "setup.cfg"
    print("\n".join(requirements(path)))
