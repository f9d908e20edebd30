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

{{/* The most pods the Deployment is asked for: the autoscaler's maximum, else replicaCount. */}}
{{- define "nmt.maxReplicas" -}}
{{- if .Values.autoscaling.enabled -}}
{{- int .Values.autoscaling.maxReplicas -}}
{{- else -}}
{{- int .Values.replicaCount -}}
{{- end -}}
{{- end -}}

{{/* Jobs live in one directory per job (nmt_serve/service/jobs_store.py), under /tmp (the pod's emptyDir)
     unless jobs.existingClaim names a shared volume: more than one pod without it would answer 404 for
     the jobs another pod made. Renders nothing; fails on what cannot work. */}}
{{- define "nmt.checkJobs" -}}
{{- $replicas := include "nmt.maxReplicas" . | int -}}
{{- $claim := .Values.jobs.existingClaim -}}
{{- if and (gt $replicas 1) (not $claim) -}}
{{- $asked := ternary (printf "autoscaling.maxReplicas=%d" $replicas) (printf "replicaCount=%d" $replicas) .Values.autoscaling.enabled -}}
{{- fail (printf "jobs.existingClaim is required with more than one replica (%s): jobs (POST /v1/jobs, /translate_file downloads) are kept on disk, and in each pod's own emptyDir a job made on one pod is 404 on the others. Create a ReadWriteMany PersistentVolumeClaim (NFSv4, CephFS, ...; locks must hold across nodes; writable by uid 10001) and name it in jobs.existingClaim, or run one replica (replicaCount=1, autoscaling.enabled=false). See values.yaml, jobs." $asked) -}}
{{- end -}}
{{- if $claim -}}
{{- $path := .Values.jobs.mountPath | toString -}}
{{- if or (not (hasPrefix "/" $path)) (eq (trimSuffix "/" $path) "" "/tmp" "/models" "/etc/nmt/api-keys") (hasPrefix "/tmp/" $path) (hasPrefix "/models/" $path) -}}
{{- fail (printf "jobs.mountPath %q: an absolute path of its own is needed, not /, /tmp (the pod's emptyDir, with the engine's sockets) or /models" $path) -}}
{{- end -}}
{{- /* against a live cluster (helm install/upgrade; `helm template` sees no cluster): a claim that exists must let every pod mount it */ -}}
{{- $pvc := lookup "v1" "PersistentVolumeClaim" .Release.Namespace $claim -}}
{{- if and $pvc (gt $replicas 1) (not (has "ReadWriteMany" ($pvc.spec.accessModes | default list))) -}}
{{- fail (printf "jobs.existingClaim %s has access modes %v: more than one replica needs ReadWriteMany (pods on other nodes could not mount it)" $claim $pvc.spec.accessModes) -}}
{{- end -}}
{{- end -}}
{{- end -}}
