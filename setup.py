"""Build hook: a wheel records the commit it was built from (``hpnlab --version`` reads it).

Everything else is declared in setup.cfg; this only adds ``hpnlab/cli/_commit.txt`` to the
built package when the source is a git checkout (an sdist or a bare copy builds without it)."""
import subprocess
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py


class BuildWithCommit(build_py):
    def run(self):
        super().run()
        try:
            head = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], capture_output=True, text=True,
                                  timeout=10, cwd=Path(__file__).parent)
        except OSError:
            return
        if head.returncode == 0 and head.stdout.strip():
            dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True,
                                   text=True, timeout=10, cwd=Path(__file__).parent).stdout.strip()
            out = Path(self.build_lib) / "hpnlab" / "cli" / "_commit.txt"
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(head.stdout.strip() + ("+modified" if dirty else "") + "\n")


setup(cmdclass={"build_py": BuildWithCommit})
