"""``python -m hpnlab.cli ...`` is the ``hpnlab`` command."""
import sys

from hpnlab.cli.main import main

sys.exit(main())
