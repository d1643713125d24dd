"""The Kubernetes operator: kopf handlers (thin) over pure reconcile logic and manifest builders.

``handlers`` holds every ``@kopf.on...`` decorator; ``reconcile`` decides, ``manifests``
builds, ``api`` serves ingest, the samples API and metrics. Importing this package does not
import kopf.
"""
