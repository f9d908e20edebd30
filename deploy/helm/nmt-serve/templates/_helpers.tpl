{{- define "nmt.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{/* Selector labels: fixed for the life of a release (a Deployment's selector cannot change). */}}
{{- define "nmt.selectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "nmt.labels" -}}
{{ include "nmt.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{/* registry/repository:tag[-gpu] or @digest; the registry is required (no public image). */}}
{{- define "nmt.image" -}}
{{- $registry := required "image.registry is required: push the image (README, \"Run it in a container\") to a registry the nodes can pull from and name it here" .Values.image.registry -}}
{{- $ref := printf "%s/%s" (trimSuffix "/" $registry) .Values.image.repository -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" $ref .Values.image.digest -}}
{{- else -}}
{{- $tag := .Values.image.tag | default .Chart.AppVersion | toString -}}
{{- if eq $tag "latest" -}}{{- fail "image.tag: latest is refused; name a version (default: the chart's appVersion) or a digest" -}}{{- end -}}
{{- printf "%s:%s%s" $ref $tag (ternary .Values.gpu.imageTagSuffix "" .Values.gpu.enabled) -}}
{{- end -}}
{{- end -}}

{{- define "nmt.apiKeysSecret" -}}
{{- required "apiKeys.existingSecret is required while apiKeys.enabled is true: create a Secret with the keys (one per line) under the key apiKeys.key, e.g. kubectl create secret generic nmt-serve-keys --from-file=api-keys=./keys.txt, and name it here (or set apiKeys.enabled=false to serve without authentication)" .Values.apiKeys.existingSecret -}}
{{- end -}}

{{- define "nmt.terminationGrace" -}}
{{- add (int .Values.lifecycle.preStopSleepSeconds) (int .Values.lifecycle.gracefulShutdownSeconds) (int .Values.lifecycle.terminationMarginSeconds) -}}
{{- end -}}
