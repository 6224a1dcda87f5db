{{/* Base name of every resource: <release>-<chart>, or fullnameOverride. */}}
{{- define "orchestrator.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 50 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 50 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 50 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "orchestrator.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "orchestrator.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/name: {{ include "orchestrator.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{- define "orchestrator.selectorLabels" -}}
app.kubernetes.io/name: {{ include "orchestrator.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "orchestrator.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{- define "orchestrator.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "orchestrator.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* The Secret holding database-url, admin-token, auth_token (and postgres-password). */}}
{{- define "orchestrator.secretName" -}}
{{- default (include "orchestrator.fullname" .) .Values.existingSecret -}}
{{- end -}}

{{- define "orchestrator.configMapName" -}}
{{- printf "%s-config" (include "orchestrator.fullname" .) -}}
{{- end -}}

{{- define "orchestrator.postgresql.fullname" -}}
{{- printf "%s-postgresql" (include "orchestrator.fullname" .) -}}
{{- end -}}

{{- define "orchestrator.ray.clusterName" -}}
{{- default (printf "%s-ray" (include "orchestrator.fullname" .)) .Values.ray.clusterName | trunc 50 | trimSuffix "-" -}}
{{- end -}}

{{/* KubeRay names the head Service <cluster>-head-svc; the RayCluster also sets it explicitly. */}}
{{- define "orchestrator.ray.headServiceName" -}}
{{- printf "%s-head-svc" (include "orchestrator.ray.clusterName" .) -}}
{{- end -}}

{{/* The Ray dashboard (Jobs and State APIs) of the cluster: the control plane's RAY_ADDRESS. */}}
{{- define "orchestrator.ray.dashboardUrl" -}}
{{- printf "http://%s.%s.svc:%d" (include "orchestrator.ray.headServiceName" .) .Release.Namespace (int .Values.ray.ports.dashboard) -}}
{{- end -}}

{{/* How drivers on the Ray nodes reach the control plane. */}}
{{- define "orchestrator.publicUrl" -}}
{{- if .Values.controlPlane.settings.publicUrl -}}
{{- .Values.controlPlane.settings.publicUrl -}}
{{- else -}}
{{- printf "http://%s.%s.svc:%d" (include "orchestrator.fullname" .) .Release.Namespace (int .Values.service.port) -}}
{{- end -}}
{{- end -}}

{{- define "orchestrator.storage" -}}
{{- default .Values.storage.mountPath .Values.storage.uri -}}
{{- end -}}

{{- define "orchestrator.codeStorage" -}}
{{- default .Values.codeStorage.mountPath .Values.codeStorage.uri -}}
{{- end -}}

{{- define "orchestrator.codeStorage.claimName" -}}
{{- default (printf "%s-code" (include "orchestrator.fullname" .)) .Values.codeStorage.persistentVolumeClaim.existingClaim -}}
{{- end -}}

{{- define "orchestrator.storage.claimName" -}}
{{- default (printf "%s-storage" (include "orchestrator.fullname" .)) .Values.storage.persistentVolumeClaim.existingClaim -}}
{{- end -}}

{{/*
Secret values: the value given in values.yaml, else the one already in the cluster's Secret (so an
upgrade keeps generated tokens), else a new random one. Call with (list $ "key" "value-from-values" length),
or (list $ "key" "value-from-values" length "secret-name") for a Secret other than the release's own.
*/}}
{{- define "orchestrator.secretValue" -}}
{{- $root := index . 0 -}}
{{- $key := index . 1 -}}
{{- $given := index . 2 -}}
{{- $length := index . 3 -}}
{{- $secretName := include "orchestrator.fullname" $root -}}
{{- if gt (len .) 4 }}{{ $secretName = index . 4 }}{{ end -}}
{{- if $given -}}
{{- $given -}}
{{- else -}}
{{- $existing := lookup "v1" "Secret" $root.Release.Namespace $secretName -}}
{{- if and $existing (hasKey ($existing.data | default dict) $key) -}}
{{- index $existing.data $key | b64dec -}}
{{- else -}}
{{- randAlphaNum $length -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/*
Environment of every Ray container (head and workers). Called with (dict "root" $ "c" <cluster>), a cluster
being "orchestrator.cluster.main" or "orchestrator.cluster.created" (templates/_clusters.tpl) read back with fromJson.
*/}}
{{- define "orchestrator.ray.env" -}}
{{- $c := .c -}}
{{- with .root -}}
- name: RAY_USAGE_STATS_ENABLED
  value: "0"
- name: RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S
  value: "5"
{{- if .Values.ray.serveHaproxy }}
- name: RAY_SERVE_ENABLE_HA_PROXY
  value: "1"
- name: RAY_SERVE_THROUGHPUT_OPTIMIZED
  value: "1"
{{- end }}
{{- if eq .Values.ray.auth.mode "disabled" }}
- name: RAY_AUTH_MODE
  value: disabled
{{- else if not .Values.ray.auth.operatorManaged }}
- name: RAY_AUTH_MODE
  value: token
- name: RAY_AUTH_TOKEN
  valueFrom:
    secretKeyRef:
      name: {{ $c.tokenSecret }}
      key: auth_token
{{- end }}
{{- with .Values.ray.extraEnv }}
{{ toYaml . }}
{{- end }}
{{- end }}
{{- end -}}

{{/* The head pod's projected ServiceAccount token, mounted into KubeRay's autoscaler container only. */}}
{{- define "orchestrator.ray.autoscalerTokenVolume" -}}
autoscaler-api-token
{{- end -}}

{{/*
Volumes and mounts of every Ray pod: memory-backed /dev/shm and the cluster's checkpoint volume (none with an
object-store URI). Called with (dict "root" $ "c" <cluster>).
*/}}
{{- define "orchestrator.ray.volumes" -}}
- name: dshm
  emptyDir:
    medium: Memory
    sizeLimit: {{ .root.Values.ray.shmSize }}
{{- with .c.claimName }}
- name: storage
  persistentVolumeClaim:
    claimName: {{ . }}
{{- end }}
{{- end -}}

{{- define "orchestrator.ray.volumeMounts" -}}
- name: dshm
  mountPath: /dev/shm
{{- if .c.claimName }}
- name: storage
  mountPath: {{ .c.mountPath }}
{{- end }}
{{- end -}}

{{/* prometheus.io/* scrape annotations of the control plane's Service and pods (metrics.annotations). */}}
{{- define "orchestrator.metrics.annotations" -}}
{{- if and .Values.metrics.annotations (ne .Values.metrics.access "off") -}}
prometheus.io/scrape: "true"
prometheus.io/port: {{ .Values.controlPlane.port | quote }}
prometheus.io/path: /metrics
{{- end -}}
{{- end -}}

{{/* The Service in front of Ray Serve's HTTP ingress on the head. */}}
{{- define "orchestrator.serve.serviceName" -}}
{{- printf "%s-serve" (include "orchestrator.fullname" .) -}}
{{- end -}}

{{/*
What clients outside the cluster call deployments at (ORCHESTRATOR_SERVE_PUBLIC_URL): serve.publicUrl,
else the Serve Ingress's https://host, else the Serve Service's in-cluster URL.
*/}}
{{- define "orchestrator.serve.publicUrl" -}}
{{- if .Values.serve.publicUrl -}}
{{- .Values.serve.publicUrl | trimSuffix "/" -}}
{{- else if .Values.serve.ingress.enabled -}}
{{- printf "https://%s" .Values.serve.ingress.host -}}
{{- else -}}
{{- printf "http://%s.%s.svc:%d" (include "orchestrator.serve.serviceName" .) .Release.Namespace (int .Values.serve.service.port) -}}
{{- end -}}
{{- end -}}

{{/*
Values that pass the schema but cannot work together: the render fails and says what to change.
*/}}
{{- define "orchestrator.checks" -}}
{{- if and .Values.postgresql.enabled .Values.database.url -}}
{{- fail "database.url is set while postgresql.enabled is true (the default, a bundled try-out database): set postgresql.enabled=false to use the external PostgreSQL at database.url" -}}
{{- end -}}
{{- if and .Values.postgresql.enabled .Values.existingSecret -}}
{{- fail (printf "existingSecret is set while postgresql.enabled is true (the default, a bundled try-out database whose password the chart generates into its own Secret): set postgresql.enabled=false to use the database-url of Secret %s" .Values.existingSecret) -}}
{{- end -}}
{{- $sqlite := false -}}
{{- range .Values.controlPlane.extraEnv -}}
{{- if and (eq (.name | default "") "ORCHESTRATOR_DATABASE_URL") (hasPrefix "sqlite" (.value | default "")) -}}
{{- $sqlite = true -}}
{{- end -}}
{{- end -}}
{{- if and $sqlite (gt (int .Values.controlPlane.replicas) 1) -}}
{{- fail (printf "controlPlane.replicas is %d but ORCHESTRATOR_DATABASE_URL is SQLite: SQLite allows one control-plane process only (leader election needs PostgreSQL); set controlPlane.replicas=1 or use PostgreSQL (postgresql.enabled, database.url or existingSecret)" (int .Values.controlPlane.replicas)) -}}
{{- end -}}
{{- include "orchestrator.clusters.checks" . -}}
{{- end -}}
