"""`python -m meanfield <command>`: same as the `meanfield` command."""

import sys

from .cli import main

sys.exit(main())
