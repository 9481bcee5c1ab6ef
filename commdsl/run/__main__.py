"""`python -m commdsl.run` and `torchrun -m commdsl.run`."""

import sys

from commdsl.run.cli import main
from commdsl.run.launch import die_with_launcher

if __name__ == "__main__":
    die_with_launcher()
    sys.exit(main())
