{{/* Names and labels shared by every template. */}}

{{- define "evalkube.name" -}}
{{- .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "evalkube.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "evalkube.selectorLabels" -}}
app.kubernetes.io/name: {{ include "evalkube.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "evalkube.labels" -}}
{{ include "evalkube.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: evalkube
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{- define "evalkube.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "evalkube.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* repository@digest when a digest is set (immutable), else repository:tag. */}}
{{- define "evalkube.imageRef" -}}
{{- if .digest -}}
{{- printf "%s@%s" .repository .digest -}}
{{- else -}}
{{- printf "%s:%s" .repository .tag -}}
{{- end -}}
{{- end -}}

{{/* Both images carry one version: image.tag, else the chart's appVersion (which is the
package's version); sandboxImage.tag overrides it for the grader image only. */}}
{{- define "evalkube.imageTag" -}}
{{- default .Chart.AppVersion .Values.image.tag -}}
{{- end -}}

{{- define "evalkube.image" -}}
{{- include "evalkube.imageRef" (dict "repository" .Values.image.repository "tag" (include "evalkube.imageTag" .) "digest" .Values.image.digest) -}}
{{- end -}}

{{- define "evalkube.sandboxImage" -}}
{{- include "evalkube.imageRef" (dict "repository" .Values.sandboxImage.repository "tag" (default (include "evalkube.imageTag" .) .Values.sandboxImage.tag) "digest" .Values.sandboxImage.digest) -}}
{{- end -}}

{{- define "evalkube.apiTokenSecret" -}}
{{- default (printf "%s-api-token" (include "evalkube.fullname" .)) .Values.api.existingSecret -}}
{{- end -}}

{{- define "evalkube.pvcName" -}}
{{- default (printf "%s-store" (include "evalkube.fullname" .)) .Values.store.sqlite.existingClaim -}}
{{- end -}}

{{/* More than one replica means peering; peering means a store shared by every replica. */}}
{{- define "evalkube.peering" -}}
{{- if gt (int .Values.replicas) 1 -}}true{{- else -}}false{{- end -}}
{{- end -}}

{{/* Fail early, at `helm install`/`helm template`, on values that cannot work. */}}
{{- define "evalkube.validate" -}}
{{- if not (has .Values.store.type (list "sqlite" "postgres")) -}}
{{- fail (printf "store.type must be sqlite or postgres (got %q)" .Values.store.type) -}}
{{- end -}}
{{- if and (gt (int .Values.replicas) 1) (ne .Values.store.type "postgres") -}}
{{- fail (printf "replicas=%d needs store.type=postgres: SQLite on a ReadWriteOnce volume has a single writer. Set replicas=1, or set store.type=postgres and store.postgres.existingSecret" (int .Values.replicas)) -}}
{{- end -}}
{{- if and (eq .Values.store.type "postgres") (not .Values.store.postgres.existingSecret) -}}
{{- fail "store.type=postgres needs store.postgres.existingSecret: a Secret whose key store.postgres.secretKey holds the SQLAlchemy URL" -}}
{{- end -}}
{{- if lt (int .Values.work.shardSize) 1 -}}
{{- fail "work.shardSize must be at least 1" -}}
{{- end -}}
{{- if or (lt (int .Values.work.parallelism) 1) (gt (int .Values.work.parallelism) 1000) -}}
{{- fail "work.parallelism must be between 1 and 1000" -}}
{{- end -}}
{{- end -}}

{{/* helm install/upgrade (not template: lookup sees no cluster there): the CRDs in the
cluster must be this chart's, since Helm never upgrades crds/ (docs/install.md#6-upgrading). */}}
{{- define "evalkube.checkCRDs" -}}
{{- if .Values.crdCheck -}}
{{- range $file := list "evalsuites.evalkube.io.yaml" "evalruns.evalkube.io.yaml" -}}
{{- $want := $.Files.Get (printf "crds/%s" $file) | fromYaml -}}
{{- $live := lookup "apiextensions.k8s.io/v1" "CustomResourceDefinition" "" $want.metadata.name -}}
{{- if $live -}}
{{- if ne (toJson (index $live.spec.versions 0).schema) (toJson (index $want.spec.versions 0).schema) -}}
{{- fail (printf "the CustomResourceDefinition %s in the cluster is not this chart's (Helm never upgrades CRDs): apply the chart's CRDs first, `kubectl apply --server-side --force-conflicts -f charts/evalkube/crds/` (docs/install.md#6-upgrading), or set crdCheck=false if you manage them another way" $want.metadata.name) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* The egress gateway's pods: never matched by the operator's selector. */}}
{{- define "evalkube.egressSelectorLabels" -}}
app.kubernetes.io/name: {{ printf "%s-egress" (include "evalkube.name" .) }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "evalkube.egressKeySecret" -}}
{{- default (printf "%s-egress-key" (include "evalkube.fullname" .)) .Values.egress.grantKey.existingSecret -}}
{{- end -}}
