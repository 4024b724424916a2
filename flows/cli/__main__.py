"""`python -m flows.cli`: the `flexmarl` command without an installed entry point."""

import sys

from flows.cli.main import main

sys.exit(main())
