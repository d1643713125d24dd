"""``evalkube submit``: the files ``evalkube run`` takes, moved to a cluster and run there.

:mod:`~evalkube.submit.plan` rewrites them for the cluster (pure but for reading and hashing
the local files), :mod:`~evalkube.submit.objects` uploads them, :mod:`~evalkube.submit.cluster`
applies the manifests and watches the run, :mod:`~evalkube.submit.command` is the command.
"""
