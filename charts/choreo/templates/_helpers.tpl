{{/* Object names: <release>-choreo unless the release name already contains the chart name. */}}
{{- define "choreo.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "choreo.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := include "choreo.name" . -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* <fullname>-<component>, kept within the 63 characters of a DNS label. */}}
{{- define "choreo.component" -}}
{{- printf "%s-%s" (include "choreo.fullname" .root | trunc (int (sub 62 (len .component)))) .component | trimSuffix "-" -}}
{{- end -}}

{{- define "choreo.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/name: {{ include "choreo.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* Selector labels of one component; never change across upgrades (selectors are immutable). */}}
{{- define "choreo.selectorLabels" -}}
app.kubernetes.io/name: {{ include "choreo.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "choreo.componentLabels" -}}
{{ include "choreo.labels" .root }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "choreo.image" -}}
{{- printf "%s:%s" .image.repository (default .root.Chart.AppVersion .image.tag) -}}
{{- end -}}

{{/* The operator's gRPC target: every ready synthesizer pod by DNS, balanced round-robin. */}}
{{- define "choreo.synthesizerAddress" -}}
{{- printf "dns:///%s-headless.%s.svc:%d" (include "choreo.component" (dict "root" . "component" "synthesizer")) .Release.Namespace (int .Values.synthesizer.port) -}}
{{- end -}}

{{- define "choreo.webhookSecret" -}}
{{- default (include "choreo.component" (dict "root" . "component" "webhook-cert")) .Values.webhook.certificate.existingSecret -}}
{{- end -}}

{{/* Pod-level fields every component shares. */}}
{{- define "choreo.podCommon" -}}
{{- with .root.Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .values.priorityClassName }}
priorityClassName: {{ . }}
{{- end }}
{{- with .values.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .values.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .values.affinity }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
securityContext:
  runAsNonRoot: true
  runAsUser: 65532
  runAsGroup: 65532
  seccompProfile:
    type: RuntimeDefault
{{- end -}}

{{- define "choreo.containerSecurity" -}}
securityContext:
  allowPrivilegeEscalation: false
  readOnlyRootFilesystem: true
  capabilities:
    drop: [ALL]
{{- end -}}

{{/* The agent's node selector as key=value pairs joined by .sep. */}}
{{- define "choreo.agentSelector" -}}
{{- $pairs := list -}}
{{- range $k, $v := .root.Values.agent.nodeSelector -}}
{{- $pairs = append $pairs (printf "%s=%s" $k $v) -}}
{{- end -}}
{{- join .sep $pairs -}}
{{- end -}}
