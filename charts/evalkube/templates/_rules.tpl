{{/* The alert rule groups of the PrometheusRule (docs/metrics.md#alerts). */}}
{{- define "evalkube.alertLabels" -}}
severity: {{ .severity }}
{{- with .extra }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{- define "evalkube.ruleGroups" -}}
{{- $r := .Values.prometheusRule -}}
{{- if lt (float64 $r.scoreRegression.maxDrop) 0.0 -}}
{{- fail (printf "prometheusRule.scoreRegression.maxDrop must be >= 0 (got %v): it is the allowed drop; the rule fires below -maxDrop" $r.scoreRegression.maxDrop) -}}
{{- end -}}
{{- if or (le (float64 $r.samplesErroring.maxRatio) 0.0) (gt (float64 $r.samplesErroring.maxRatio) 1.0) -}}
{{- fail (printf "prometheusRule.samplesErroring.maxRatio must be in (0, 1] (got %v)" $r.samplesErroring.maxRatio) -}}
{{- end -}}
{{- $job := default (include "evalkube.fullname" .) $r.operatorDown.job -}}
groups:
  - name: evalkube.rules
    rules:
      {{- if $r.gateFailed.enabled }}
      - alert: EvalkubeGateFailed
        expr: evalkube_gate_passed == 0
        labels:
          {{- include "evalkube.alertLabels" (dict "severity" $r.gateFailed.severity "extra" $r.alertLabels) | nindent 10 }}
        annotations:
          summary: "EvalRun {{`{{ $labels.namespace }}/{{ $labels.run }}`}} failed its gate"
          description: "The gate of EvalRun {{`{{ $labels.run }}`}} (suite {{`{{ $labels.suite }}`}}) failed: kubectl describe evalrun -n {{`{{ $labels.namespace }}`}} {{`{{ $labels.run }}`}} lists each failed check."
      {{- end }}
      {{- if $r.scoreRegression.enabled }}
      - alert: EvalkubeScoreRegressed
        expr: evalkube_score_baseline_delta < -{{ $r.scoreRegression.maxDrop }}
        labels:
          {{- include "evalkube.alertLabels" (dict "severity" $r.scoreRegression.severity "extra" $r.alertLabels) | nindent 10 }}
        annotations:
          summary: "{{`{{ $labels.metric }}`}} of {{`{{ $labels.suite }}/{{ $labels.task }}`}} on {{`{{ $labels.model }}`}} dropped versus its baseline"
          description: "{{`{{ $labels.metric }}`}} changed by {{`{{ $value }}`}} versus the gate's baseline run (more than {{ $r.scoreRegression.maxDrop }} lower) in namespace {{`{{ $labels.namespace }}`}}."
      {{- end }}
      {{- if $r.runsFailing.enabled }}
      - alert: EvalkubeRunsFailing
        expr: sum(evalkube_runs{phase="Failed"}) - (sum(evalkube_runs{phase="Failed"} offset {{ $r.runsFailing.window }}) or vector(0)) > 0
        labels:
          {{- include "evalkube.alertLabels" (dict "severity" $r.runsFailing.severity "extra" $r.alertLabels) | nindent 10 }}
        annotations:
          summary: "{{`{{ $value }}`}} EvalRun(s) failed in the last {{ $r.runsFailing.window }}"
          description: "EvalRuns ended Failed (units crashed or never reported): kubectl get evalruns -A shows which; their Succeeded condition names each failed unit."
      {{- end }}
      {{- if $r.samplesErroring.enabled }}
      - alert: EvalkubeSamplesErroring
        expr: |-
          sum by (namespace, suite) (increase(evalkube_samples_total{status=~"invalid|errored"}[{{ $r.samplesErroring.window }}]))
            / sum by (namespace, suite) (increase(evalkube_samples_total[{{ $r.samplesErroring.window }}]))
            > {{ $r.samplesErroring.maxRatio }}
        labels:
          {{- include "evalkube.alertLabels" (dict "severity" $r.samplesErroring.severity "extra" $r.alertLabels) | nindent 10 }}
        annotations:
          summary: "{{`{{ $value | humanizePercentage }}`}} of the samples of suite {{`{{ $labels.namespace }}/{{ $labels.suite }}`}} were invalid or errored"
          description: "More than {{ $r.samplesErroring.maxRatio }} of the samples of completed runs in the last {{ $r.samplesErroring.window }} were invalid or errored: evalkube samples RUN --api URL --status errored shows them."
      {{- end }}
      {{- if $r.budgetExhausted.enabled }}
      - alert: EvalkubeModelBudgetExhausted
        expr: sum by (namespace, suite, scope) (increase(evalkube_model_budget_refusals_total{scope=~"execution|unit"}[{{ $r.budgetExhausted.window }}])) > 0
        labels:
          {{- include "evalkube.alertLabels" (dict "severity" $r.budgetExhausted.severity "extra" $r.alertLabels) | nindent 10 }}
        annotations:
          summary: "Graders of suite {{`{{ $labels.namespace }}/{{ $labels.suite }}`}} ran out of model calls ({{`{{ $labels.scope }}`}} budget)"
          description: "Work-unit proxies refused graders' model calls because the {{`{{ $labels.scope }}`}} budget (maxModelCalls) was exhausted, in runs completed in the last {{ $r.budgetExhausted.window }}: those samples were graded without the calls they asked for."
      {{- end }}
      {{- if $r.operatorDown.enabled }}
      - alert: EvalkubeOperatorDown
        expr: absent(up{job="{{ $job }}", namespace="{{ .Release.Namespace }}"} == 1)
        for: {{ $r.operatorDown.for }}
        labels:
          {{- include "evalkube.alertLabels" (dict "severity" $r.operatorDown.severity "extra" $r.alertLabels) | nindent 10 }}
        annotations:
          summary: "The evalkube operator is down"
          description: "No target of job {{ $job }} in namespace {{ .Release.Namespace }} is up: EvalRuns are not reconciled and metrics are stale."
      {{- end }}
{{- end -}}
