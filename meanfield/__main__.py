"""`python -m meanfield <command>`: same as the `meanfield` command."""

import sys

from ._app.cli import main

sys.exit(main())
