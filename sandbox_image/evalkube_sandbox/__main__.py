"""``python -m evalkube_sandbox``: serve grader executions.

Without arguments: on stdin/stdout frames (local sandboxes). With ``--listen PATH``: as the
grader container of a work-unit pod, one fresh worker per connection on a unix socket.
"""

import sys

if len(sys.argv) == 3 and sys.argv[1] == "--listen":
    from evalkube_sandbox.serve import serve

    raise SystemExit(serve(sys.argv[2]))

from evalkube_sandbox.worker import main

raise SystemExit(main())
