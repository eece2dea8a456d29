{{/* The chart's name, or nameOverride. */}}
{{- define "sluice.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The name of every object: the release's name, with the chart's appended unless it already holds it. */}}
{{- define "sluice.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/* The labels that select the pods: never changed by an upgrade, since a Deployment's selector cannot be. */}}
{{- define "sluice.selectorLabels" -}}
app.kubernetes.io/name: {{ include "sluice.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "sluice.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "sluice.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "sluice.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}
{{- end }}

{{/* The ConfigMap mounted as the rules directory. */}}
{{- define "sluice.rulesConfigMap" -}}
{{- default (printf "%s-rules" (include "sluice.fullname" .)) .Values.rules.existingConfigMap }}
{{- end }}

{{/* Whether the chart creates a Secret: for an inline Redis URL or admin token. */}}
{{- define "sluice.ownSecret" -}}
{{- if or .Values.redis.url .Values.adminToken.value }}true{{ end }}
{{- end }}

{{/* Whether counters are shared in Redis; fails on values that contradict each other. */}}
{{- define "sluice.redis" -}}
{{- if and .Values.redis.url .Values.redis.existingSecret }}
{{- fail "redis.url and redis.existingSecret are both set: give the URL one way" }}
{{- end }}
{{- if and .Values.adminToken.value .Values.adminToken.existingSecret }}
{{- fail "adminToken.value and adminToken.existingSecret are both set: give the token one way" }}
{{- end }}
{{- if and .Values.redis.url .Values.adminToken.value (eq .Values.redis.existingSecretKey .Values.adminToken.existingSecretKey) }}
{{- fail "redis.existingSecretKey and adminToken.existingSecretKey name the same key of the chart's Secret" }}
{{- end }}
{{- if or .Values.redis.url .Values.redis.existingSecret }}true
{{- else if .Values.autoscaling.enabled }}
{{- fail "autoscaling.enabled needs redis.url or redis.existingSecret: counters in memory are per pod, so each pod would allow the whole limit" }}
{{- else if gt (int .Values.replicaCount) 1 }}
{{- fail (printf "replicaCount %d needs redis.url or redis.existingSecret: counters in memory are per pod, so each pod would allow the whole limit" (int .Values.replicaCount)) }}
{{- end }}
{{- end }}
