{{/* The name of every object: the release's, with "tidemark" unless the release says it. */}}
{{- define "tidemark.fullname" -}}
{{- if contains "tidemark" .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-tidemark" .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "tidemark.selectorLabels" -}}
app.kubernetes.io/name: tidemark
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "tidemark.labels" -}}
{{ include "tidemark.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{- define "tidemark.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "tidemark.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "tidemark.image" -}}
{{- $tag := default .Chart.AppVersion .Values.image.tag -}}
{{- if .Values.image.digest -}}
{{- printf "%s:%s@%s" .Values.image.repository $tag .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository $tag -}}
{{- end -}}
{{- end -}}

{{/*
Memory for the fleet (docs/limits.md, "Sizing serve"): a replica may hold every workspace, so it is
sized for all of fleet.devices. Measured: 100,000 devices peak at 661 MiB resident, a million at
1,815 MiB (a resync of a whole read). Returns "REQUEST LIMIT".
*/}}
{{- define "tidemark.fleetMemory" -}}
{{- $devices := int64 .Values.fleet.devices -}}
{{- if le $devices 100000 -}}768Mi 1Gi
{{- else if le $devices 1000000 -}}2Gi 3Gi
{{- else if le $devices 5000000 -}}6Gi 8Gi
{{- else -}}
{{- $millions := div (add $devices 999999) 1000000 -}}
{{- printf "%dGi %dGi" (add $millions 1) (add (div (mul $millions 3) 2) 1) -}}
{{- end -}}
{{- end -}}

{{- define "tidemark.memoryRequest" -}}
{{- default (index (splitList " " (include "tidemark.fleetMemory" .)) 0) .Values.resources.memory.request -}}
{{- end -}}

{{- define "tidemark.memoryLimit" -}}
{{- default (index (splitList " " (include "tidemark.fleetMemory" .)) 1) .Values.resources.memory.limit -}}
{{- end -}}

{{/* The names of the variables the pod is given. */}}
{{- define "tidemark.givenVariables" -}}
{{- $names := list "TIDEMARK_STATE_URL" "TIDEMARK_CACHE_DIR" -}}
{{- if .Values.state.passwordSecret.name }}{{ $names = append $names .Values.state.passwordSecret.key }}{{ end -}}
{{- if .Values.credentials.secret.name }}{{ $names = append $names .Values.credentials.variable }}{{ end -}}
{{- range .Values.secretEnv }}{{ $names = append $names .name }}{{ end -}}
{{- range .Values.env }}{{ $names = append $names .name }}{{ end -}}
{{- join " " $names -}}
{{- end -}}

{{/*
Every variable tidemark.yaml names (url_env, secret_env, credentials_env) must be given: serve stops
at start on an unset one, so the chart refuses to render instead, naming it.
*/}}
{{- define "tidemark.checkVariables" -}}
{{- $given := splitList " " (include "tidemark.givenVariables" .) -}}
{{- range (regexFindAll "[a-z_]+_env: *['\"]?[A-Za-z_][A-Za-z0-9_]*" (toYaml .Values.config) -1) -}}
{{- $parts := regexSplit ": *" . 2 -}}
{{- $variable := trimAll "'\"" (index $parts 1) -}}
{{- if not (has $variable $given) -}}
{{- fail (printf "config (tidemark.yaml) names %s in '%s', but the chart gives the pod no such variable; add it to secretEnv (from a Secret) or env" $variable (index $parts 0)) -}}
{{- end -}}
{{- end -}}
{{- end -}}
