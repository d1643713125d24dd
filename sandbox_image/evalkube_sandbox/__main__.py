"""``python -m evalkube_sandbox``: serve grader executions on stdin/stdout frames."""

from evalkube_sandbox.worker import main

raise SystemExit(main())
