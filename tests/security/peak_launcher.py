"""Run a command and write its exit code and peak RSS to a file: the middle process of
:func:`bounded.run_bounded`.

A direct child of pytest would report pytest's own RSS as its peak: on ``exec`` the kernel
folds the high-water mark of the address space being replaced (the forked copy of the
parent) into the child's ``ru_maxrss``. This launcher is a fresh, small Python; the command
it spawns inherits only the launcher's few megabytes, so ``wait4`` measures the command.

Usage: ``python peak_launcher.py RESULT_JSON ADDRESS_SPACE_BYTES COMMAND...``
(``ADDRESS_SPACE_BYTES`` 0 sets no ``RLIMIT_AS``).
"""

from __future__ import annotations

import json
import os
import resource
import sys


def main() -> None:
    result_path, address_space, *command = sys.argv[1:]
    if int(address_space):
        limit = int(address_space)
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    pid = os.posix_spawn(command[0], command, os.environ)
    _, status, usage = os.wait4(pid, 0)
    with open(result_path, "w", encoding="utf-8") as handle:
        json.dump(
            {"code": os.waitstatus_to_exitcode(status), "peak_rss_kb": usage.ru_maxrss}, handle
        )


if __name__ == "__main__":
    main()
