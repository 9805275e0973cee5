{{/*
Names. Kubernetes names are at most 63 characters; the Job name is kept at 52 so that the
controller's pod-name suffix still fits.
*/}}
{{- define "soak-sidecar.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "soak-sidecar.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 52 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 52 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 52 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "soak-sidecar.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "soak-sidecar.selectorLabels" -}}
app.kubernetes.io/name: {{ include "soak-sidecar.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "soak-sidecar.labels" -}}
helm.sh/chart: {{ include "soak-sidecar.chart" . }}
{{ include "soak-sidecar.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: soak-sidecar
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{- define "soak-sidecar.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "soak-sidecar.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "soak-sidecar.image" -}}
{{- $tag := default .Chart.AppVersion .Values.image.tag }}
{{- if .Values.image.digest }}
{{- printf "%s:%s@%s" .Values.image.repository $tag .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository $tag }}
{{- end }}
{{- end }}

{{- define "soak-sidecar.trainerImage" -}}
{{- default (include "soak-sidecar.image" .) .Values.trainer.image }}
{{- end }}

{{/*
Exit codes of soak-sidecar (sidecar/core/exitcodes.py, ExitCode). 1-127 are permanent: the Job
fails at once. The named retryable codes (ExitCode members >= 128 that are failures) get
job.retryableExitCodeAction; those that are no failure (a suspended Job) are ignored; other codes
>= 128 (a signal killed the sidecar, e.g. 137 after an OOM kill) fall to the default action, Count.
*/}}
{{- define "soak-sidecar.permanentExitCodes" -}}
[{{ join ", " (untilStep 1 128 1) }}]
{{- end }}

{{/* BEGIN exit-code-lists: generated from ExitCode by tools/gen_docs.py, do not edit */}}
{{- define "soak-sidecar.retryableExitCodes" -}}
[150, 151, 152]
{{- end }}

{{- define "soak-sidecar.ignoredExitCodes" -}}
[153]
{{- end }}
{{/* END exit-code-lists */}}

{{/* The trainer's and the init container's securityContext: podSecurity's UID (the sidecar has its own). */}}
{{- define "soak-sidecar.containerSecurityContext" -}}
{{- include "soak-sidecar.securityContext" (dict "uid" .Values.podSecurity.runAsUser "gid" .Values.podSecurity.runAsGroup) }}
{{- end }}

{{/*
The sidecar's container securityContext: its own UID, so the trainer cannot reach its secrets.
*/}}
{{- define "soak-sidecar.sidecarSecurityContext" -}}
{{- include "soak-sidecar.securityContext" (dict "uid" .Values.sidecar.runAsUser "gid" .Values.sidecar.runAsGroup) }}
{{- end }}

{{- define "soak-sidecar.securityContext" -}}
runAsNonRoot: true
runAsUser: {{ .uid }}
runAsGroup: {{ .gid }}
allowPrivilegeEscalation: false
privileged: false
readOnlyRootFilesystem: true
capabilities:
  drop:
    - ALL
seccompProfile:
  type: RuntimeDefault
{{- end }}

{{/*
A number as an env value: whole numbers without the float64 exponent form Helm prints for
JSON-sourced values ("1000000", not "1e+06"), fractions as they are.
*/}}
{{- define "soak-sidecar.number" -}}
{{- if eq (float64 .) (float64 (int64 .)) }}
{{- int64 . }}
{{- else }}
{{- . }}
{{- end }}
{{- end }}

{{/*
The rendezvous of a multi-node trainer (Indexed Jobs): index 0's stable name, the number of nodes
and this pod's rank, as torchrun and most launchers read them (PET_* are torchrun's own).
*/}}
{{- define "soak-sidecar.rendezvousEnv" -}}
{{- $master := printf "%s-0.%s.%s.svc" .fullname .fullname .root.Release.Namespace }}
- name: NODE_RANK
  valueFrom:
    fieldRef:
      fieldPath: metadata.annotations['batch.kubernetes.io/job-completion-index']
- name: NNODES
  value: {{ .root.Values.job.completions | quote }}
- name: MASTER_ADDR
  value: {{ $master | quote }}
- name: MASTER_PORT
  value: {{ .root.Values.job.rendezvousPort | quote }}
- name: PET_NODE_RANK
  valueFrom:
    fieldRef:
      fieldPath: metadata.annotations['batch.kubernetes.io/job-completion-index']
- name: PET_NNODES
  value: {{ .root.Values.job.completions | quote }}
- name: PET_MASTER_ADDR
  value: {{ $master | quote }}
- name: PET_MASTER_PORT
  value: {{ .root.Values.job.rendezvousPort | quote }}
{{- end }}
