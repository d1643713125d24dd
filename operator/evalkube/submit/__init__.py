"""``evalkube submit``: the files ``evalkube run`` takes, moved to a cluster and run there.

- :mod:`evalkube.submit.plan` turns a loaded suite and run into what a cluster reads (pure
  but for reading and hashing the local files): local datasets and outputs become ``s3://``
  objects to upload (content-addressed) or ConfigMaps, grader files keys of the suite's code
  ConfigMap, and every manifest to apply; what a cluster cannot run is refused, naming the
  field and the fix.
- :mod:`evalkube.submit.objects` uploads to the object store (s3fs; HEAD first, streamed).
- :mod:`evalkube.submit.cluster` applies the manifests (lightkube, server-side apply) and
  watches the EvalRun.
- :mod:`evalkube.submit.command` is the command: upload, apply, watch with progress bars,
  print the scores table and the gate, and exit with ``evalkube run``'s codes.
"""
