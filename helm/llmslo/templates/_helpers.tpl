{{/* The chart's name, shortened to what Kubernetes names allow. */}}
{{- define "llmslo.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The release's base name for every object. */}}
{{- define "llmslo.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else if contains (include "llmslo.name" .) .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name (include "llmslo.name" .) | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}

{{/* The injector's objects' name. */}}
{{- define "llmslo.injector" -}}
{{- printf "%s-injector" (include "llmslo.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The Secret holding the webhook's certificate. */}}
{{- define "llmslo.tlsSecret" -}}
{{- printf "%s-tls" (include "llmslo.injector" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Labels on every object. */}}
{{- define "llmslo.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/name: {{ include "llmslo.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{/* Labels that select the injector's pods. */}}
{{- define "llmslo.injectorSelector" -}}
app.kubernetes.io/name: {{ include "llmslo.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: injector
{{- end }}

{{/* The llmslo image: llmslo publishes none, so the chart needs the one you built. */}}
{{- define "llmslo.image" -}}
{{- $repository := required "image.repository is required: llmslo publishes no image. Build one from the repository's Dockerfile (docker build -t REGISTRY/llmslo:TAG .), push it, and set --set image.repository=REGISTRY/llmslo --set image.tag=TAG" .Values.image.repository }}
{{- printf "%s:%s" $repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{/* Whether to render the Prometheus operator's objects: when its API is served (`auto`), or
always (GitOps renders with `helm template`, which sees no cluster), or never. */}}
{{- define "llmslo.hasOperator" -}}
{{- $render := .Values.prometheusOperator.render }}
{{- if or (eq $render "always") (and (eq $render "auto") (.Capabilities.APIVersions.Has "monitoring.coreos.com/v1")) }}true{{ end }}
{{- end }}

{{/* The sidecar mode: native sidecars need Kubernetes 1.29 (beta, on by default). */}}
{{- define "llmslo.sidecarMode" -}}
{{- if ne .Values.injector.sidecarMode "auto" }}
{{- .Values.injector.sidecarMode }}
{{- else if semverCompare ">=1.29-0" .Capabilities.KubeVersion.Version }}native
{{- else }}classic
{{- end }}
{{- end }}
