"""`python -m commdsl.run` and `torchrun -m commdsl.run`."""

import sys

from commdsl.run.cli import main

if __name__ == "__main__":
    sys.exit(main())
