{{/* Names and labels. */}}
{{- define "toolgate.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "toolgate.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else if contains (include "toolgate.name" .) .Release.Name -}}
{{- printf "%s-operator" .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s-operator" .Release.Name (include "toolgate.name" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "toolgate.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "toolgate.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "toolgate.selectorLabels" -}}
app.kubernetes.io/name: {{ include "toolgate.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end -}}

{{- define "toolgate.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{ include "toolgate.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: toolgate
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{- define "toolgate.operatorImage" -}}
{{- $i := .Values.operator.image -}}
{{- if $i.digest -}}{{ printf "%s@%s" $i.repository $i.digest }}{{- else -}}{{ printf "%s:%s" $i.repository (default .Chart.AppVersion $i.tag) }}{{- end -}}
{{- end -}}

{{- define "toolgate.proxyImage" -}}
{{- $i := .Values.proxy.image -}}
{{- if $i.digest -}}{{ printf "%s@%s" $i.repository $i.digest }}{{- else -}}{{ printf "%s:%s" $i.repository (default .Chart.AppVersion $i.tag) }}{{- end -}}
{{- end -}}
