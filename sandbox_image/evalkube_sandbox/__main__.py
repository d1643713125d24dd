"""``python -m evalkube_sandbox``: serve grader executions.

Without arguments: on stdin/stdout frames (local sandboxes). With ``--connect PATH ...``: as the
first process of the grader container of a work-unit pod (:mod:`evalkube_sandbox.serve`).
"""

import sys

if len(sys.argv) > 2 and sys.argv[1] == "--connect":
    from evalkube_sandbox.serve import main as serve

    raise SystemExit(serve(sys.argv[1:]))

from evalkube_sandbox.worker import main

raise SystemExit(main())
