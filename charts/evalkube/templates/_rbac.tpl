{{/* The operator's permissions, one rule a line: a new kind is one more line (or one more
resource in a line). docs/install.md#rbac says why each is needed. */}}

{{/* Namespaces watched: watchNamespaces plus the older single watchNamespace; empty = all. */}}
{{- define "evalkube.watchNamespaces" -}}
{{- $all := concat (.Values.watchNamespaces | default list) (compact (list .Values.watchNamespace)) -}}
{{- toJson (uniq $all) -}}
{{- end -}}

{{/* What the operator does inside a watched namespace: in a Role there (watchNamespaces), or
in a ClusterRole bound cluster-wide. No `update` (kopf and the operator only patch), no
delete but of EvalRuns a schedule no longer keeps (ownerReferences clean up the rest), no list/watch except where it lists. */}}
{{- define "evalkube.namespacedRules" -}}
# its own kinds: read specs; kopf's annotations (patch) and status (patch)
- {apiGroups: [evalkube.io], resources: [evalsuites, evalruns, evalschedules], verbs: [get, list, watch, patch]}
- {apiGroups: [evalkube.io], resources: [evalsuites/status, evalruns/status, evalschedules/status], verbs: [get, patch]}
# EvalSchedules create their EvalRuns and delete those beyond the history limits
- {apiGroups: [evalkube.io], resources: [evalruns], verbs: [create, delete]}
# ownerReferences with blockOwnerDeletion on what it creates (OwnerReferencesPermissionEnforcement)
- {apiGroups: [evalkube.io], resources: [evalruns/finalizers, evalschedules/finalizers], verbs: [update]}
# one Job per work unit; the run's Jobs are listed by label, and watched: their changes
# advance the run
- {apiGroups: [batch], resources: [jobs], verbs: [list, watch, create]}
# one NetworkPolicy per run
- {apiGroups: [networking.k8s.io], resources: [networkpolicies], verbs: [create]}
# the run's ingest-token and egress-grant Secrets: created, the grant renewed in place; never
# read (no get/list/watch), and patch is confined to those Secrets (secret-policy.yaml)
- {apiGroups: [""], resources: [secrets], verbs: [create, patch]}
{{- with .Values.rbac.trackingSecrets }}
# the MLflow credentials of spec.tracking.mlflow: read by name, only those named here
- {apiGroups: [""], resources: [secrets], verbs: [get], resourceNames: {{ toJson . }}}
{{- end }}
# grader files and datasets read by name, and watched so an edit re-checks the suites that
# read them; the run's suite snapshot created
- {apiGroups: [""], resources: [configmaps], verbs: [get, list, watch, create]}
# Kubernetes Events explaining each step
- {apiGroups: [""], resources: [events], verbs: [create]}
{{- if eq (include "evalkube.peering" .) "true" }}
# kopf peering in the namespace (several replicas)
- {apiGroups: [kopf.dev], resources: [kopfpeerings], verbs: [get, list, watch, patch]}
{{- end }}
{{- end -}}

{{/* Cluster-scoped, only when every namespace is watched: kopf follows the CRDs (a CRD
installed after the operator), and replicas find each other in the ClusterKopfPeering. */}}
{{- define "evalkube.clusterRules" -}}
- {apiGroups: [apiextensions.k8s.io], resources: [customresourcedefinitions], verbs: [get, list, watch]}
{{- if eq (include "evalkube.peering" .) "true" }}
- {apiGroups: [kopf.dev], resources: [clusterkopfpeerings], verbs: [get, list, watch, patch]}
{{- end }}
{{- end -}}
