"""Entry point of a Python target's fresh interpreter (see `core.py`).

Reads the preparation data and the pickled process object from the fd given
as the last argument, exactly as `multiprocessing`'s spawn start method does,
then runs the target and exits with its exit code.
"""

import os
import sys


def main() -> None:
    """Runs the target whose pickle arrives on fd `sys.argv[-1]`."""
    from multiprocessing import spawn

    fd = int(sys.argv[-1])
    parent_sentinel = os.dup(fd)
    sys.exit(spawn._main(fd, parent_sentinel))
