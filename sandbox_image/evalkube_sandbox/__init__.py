"""The evalkube grader worker: runs untrusted grader code inside a sandbox.

Standard library only, and nothing from ``evalkube``: this package is all the sandbox image
holds. It speaks length-prefixed JSON frames over a pair of file descriptors (pipes locally,
a unix socket in a pod); see :mod:`evalkube_sandbox.protocol`.
"""

PROTOCOL_VERSION = 1
