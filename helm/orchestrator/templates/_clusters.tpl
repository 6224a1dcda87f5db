{{/*
The Ray clusters of a release (issue 31, docs/clusters.md): the chart's own RayCluster (ray.*), the control
plane's default cluster, and the entries of `clusters`: created ones (`create: true`: a RayCluster, token Secret,
NetworkPolicies, storage and Serve Service of their own) and external ones (`address:`, registered only).

A cluster, as the templates that render one read it (a JSON object, read back with fromJson):
  name              the RayCluster's name (also the prefix of its head Service, Secret, PVC, ...)
  registryName      the name the control plane registers it under ("" for the chart's own: ORCHESTRATOR_CLUSTER_NAME)
  valuesPath        where its values are, for error messages
  headComponent / workerComponent   app.kubernetes.io/component of its pods
  podLabels         more labels of its pods (and of its RayCluster and head Service)
  head / workerGroups   ray.head and ray.workerGroups, with a created entry's own over them, field by field
  tokenSecret       the Secret whose auth_token is its Ray token
  claimName / mountPath   its checkpoint volume (claimName "": none, an object-store URI)
  pvc               the PersistentVolumeClaim the chart makes for a created cluster's own storage ({}: none)
  storageRoot       where runs on it write (the mount path or the URI)
  policyName        base name of its NetworkPolicies
  headServiceName / serveServiceName
*/}}

{{/* The chart's own Ray cluster (ray.*): exactly what the chart rendered before `clusters` existed. */}}
{{- define "orchestrator.cluster.main" -}}
{{- $claim := "" -}}
{{- if not .Values.storage.uri }}{{ $claim = include "orchestrator.storage.claimName" . }}{{ end -}}
{{- toJson (dict
  "name" (include "orchestrator.ray.clusterName" .)
  "registryName" ""
  "valuesPath" "ray"
  "headComponent" "ray-head"
  "workerComponent" "ray-worker"
  "podLabels" (dict)
  "head" .Values.ray.head
  "workerGroups" .Values.ray.workerGroups
  "tokenSecret" (include "orchestrator.secretName" .)
  "claimName" $claim
  "mountPath" .Values.storage.mountPath
  "storageRoot" (include "orchestrator.storage" .)
  "policyName" (printf "%s-ray" (include "orchestrator.fullname" .))
  "headServiceName" (include "orchestrator.ray.headServiceName" .)
  "serveServiceName" (include "orchestrator.serve.serviceName" .)
) -}}
{{- end -}}

{{/*
A created entry of `clusters` (call with (list $ entry)). Its RayCluster is <fullname>-<name> (at most 47
characters, so that every name made from it stays within Kubernetes' 63). Pods carry the component
cluster-ray-head / cluster-ray-worker and orchestrator/cluster: <name>, so that no selector of the chart's own
cluster (its Serve Service, its autoscaler's NetworkPolicy) picks them up.
*/}}
{{- define "orchestrator.cluster.created" -}}
{{- $root := index . 0 -}}
{{- $entry := index . 1 -}}
{{- $name := printf "%s-%s" (include "orchestrator.fullname" $root) $entry.name | trunc 47 | trimSuffix "-" -}}
{{- $head := deepCopy $root.Values.ray.head -}}
{{- range $key, $value := ($entry.head | default dict) }}{{ $_ := set $head $key $value }}{{ end -}}
{{- $groups := deepCopy $root.Values.ray.workerGroups -}}
{{- range $group, $spec := ($entry.workerGroups | default dict) -}}
{{- $merged := deepCopy (get $groups $group | default dict) -}}
{{- range $key, $value := $spec }}{{ $_ := set $merged $key $value }}{{ end -}}
{{- $_ := set $groups $group $merged -}}
{{- end -}}
{{- $claim := "" -}}
{{- $pvc := dict -}}
{{- $mountPath := $entry.mountPath | default (printf "%s-%s" $root.Values.storage.mountPath $entry.name) -}}
{{- $storageRoot := $mountPath -}}
{{- if eq ($entry.storage | default "own") "shared" -}}
{{- $mountPath = $root.Values.storage.mountPath -}}
{{- $storageRoot = include "orchestrator.storage" $root -}}
{{- if not $root.Values.storage.uri }}{{ $claim = include "orchestrator.storage.claimName" $root }}{{ end -}}
{{- else -}}
{{- $given := $entry.persistentVolumeClaim | default dict -}}
{{- $claim = $given.existingClaim | default (printf "%s-storage" $name) -}}
{{- if not $given.existingClaim -}}
{{- $pvc = omit $root.Values.storage.persistentVolumeClaim "existingClaim" | deepCopy -}}
{{- range $key, $value := $given }}{{ $_ := set $pvc $key $value }}{{ end -}}
{{- end -}}
{{- end -}}
{{- toJson (dict
  "name" $name
  "registryName" $entry.name
  "valuesPath" (printf "clusters[%s]" $entry.name)
  "headComponent" "cluster-ray-head"
  "workerComponent" "cluster-ray-worker"
  "podLabels" (dict "orchestrator/cluster" $entry.name)
  "head" $head
  "workerGroups" $groups
  "tokenSecret" (printf "%s-ray-token" $name)
  "claimName" $claim
  "pvc" $pvc
  "mountPath" $mountPath
  "storageRoot" $storageRoot
  "policyName" (printf "%s-ray" $name)
  "headServiceName" (printf "%s-head-svc" $name)
  "serveServiceName" (printf "%s-serve" $name)
) -}}
{{- end -}}

{{/* Every created entry of `clusters`, as {"items": [cluster, ...]} (fromJson reads objects only). */}}
{{- define "orchestrator.clusters.created" -}}
{{- $items := list -}}
{{- range .Values.clusters -}}
{{- if .create -}}
{{- $items = append $items (include "orchestrator.cluster.created" (list $ .) | fromJson) -}}
{{- end -}}
{{- end -}}
{{- toJson (dict "items" $items) -}}
{{- end -}}

{{/* The control plane's environment variable holding a cluster's Ray token: RAY_TOKEN_<NAME>, '-' as '_'. */}}
{{- define "orchestrator.clusters.tokenEnv" -}}
{{- printf "RAY_TOKEN_%s" (. | upper | replace "-" "_") -}}
{{- end -}}

{{/*
The ORCHESTRATOR_CLUSTERS setting: a JSON list of POST /v1/clusters bodies, one per entry of `clusters`. A
created cluster's address is its head Service's dashboard, its Serve URL its Serve Service; an external one's
are the entry's. token_ref names the RAY_TOKEN_<NAME> variable the Deployment fills from the cluster's Secret.
*/}}
{{- define "orchestrator.clusters.registry" -}}
{{- $root := . -}}
{{- $out := list -}}
{{- range .Values.clusters -}}
{{- $tokenRef := printf "env:%s" (include "orchestrator.clusters.tokenEnv" .name) -}}
{{- $body := dict "name" .name "labels" (.labels | default dict) "tenancy" (.tenancy | default "shared") -}}
{{- if .create -}}
{{- $c := include "orchestrator.cluster.created" (list $root .) | fromJson -}}
{{- $_ := set $body "address" (printf "http://%s.%s.svc:%d" $c.headServiceName $root.Release.Namespace (int $root.Values.ray.ports.dashboard)) -}}
{{- $_ := set $body "token_ref" (ternary $tokenRef nil (eq $root.Values.ray.auth.mode "token")) -}}
{{- $_ := set $body "storage_root" $c.storageRoot -}}
{{- $_ := set $body "serve_url" (.serveUrl | default (printf "http://%s.%s.svc:%d" $c.serveServiceName $root.Release.Namespace (int $root.Values.serve.service.port))) -}}
{{- else -}}
{{- $_ := set $body "address" .address -}}
{{- $_ := set $body "token_ref" (ternary $tokenRef nil (not (empty .tokenSecret))) -}}
{{- $_ := set $body "storage_root" (.storageRoot | default nil) -}}
{{- $_ := set $body "serve_url" (.serveUrl | default nil) -}}
{{- $_ := set $body "serve_port" (.servePort | default nil) -}}
{{- end -}}
{{- $out = append $out $body -}}
{{- end -}}
{{- toJson $out -}}
{{- end -}}

{{/* The control plane's RAY_TOKEN_<NAME> variables (one per cluster with a token) and ORCHESTRATOR_CLUSTERS. */}}
{{- define "orchestrator.clusters.env" -}}
{{- $root := . -}}
{{- range .Values.clusters }}
{{- if .create }}
{{- if eq $root.Values.ray.auth.mode "token" }}
- name: {{ include "orchestrator.clusters.tokenEnv" .name }}
  valueFrom:
    secretKeyRef:
      name: {{ (include "orchestrator.cluster.created" (list $root .) | fromJson).tokenSecret }}
      key: auth_token
{{- end }}
{{- else if .tokenSecret }}
- name: {{ include "orchestrator.clusters.tokenEnv" .name }}
  valueFrom:
    secretKeyRef:
      name: {{ .tokenSecret.name }}
      key: {{ .tokenSecret.key }}
{{- end }}
{{- end }}
- name: ORCHESTRATOR_CLUSTERS
  value: {{ include "orchestrator.clusters.registry" . | quote }}
{{- end -}}

{{/*
`clusters` values that pass the schema but cannot work: the render fails and says what to change. Names are
unique, none is the control plane's own cluster's (ORCHESTRATOR_CLUSTER_NAME, "local" unless
controlPlane.extraEnv sets it), and no created cluster's RayCluster name is another's or the chart's own.
*/}}
{{- define "orchestrator.clusters.checks" -}}
{{- $default := "local" -}}
{{- range .Values.controlPlane.extraEnv -}}
{{- if eq (.name | default "") "ORCHESTRATOR_CLUSTER_NAME" }}{{ $default = .value | default "local" }}{{ end -}}
{{- end -}}
{{- $names := dict -}}
{{- $rayClusters := dict (include "orchestrator.ray.clusterName" .) "ray.clusterName (the chart's own RayCluster)" -}}
{{- range .Values.clusters -}}
{{- if eq .name $default -}}
{{- fail (printf "clusters: %q is the name of the control plane's own cluster (ORCHESTRATOR_CLUSTER_NAME, the RayCluster of ray.*): give the entry another name" .name) -}}
{{- end -}}
{{- if hasKey $names .name -}}
{{- fail (printf "clusters: the name %q is given twice: every cluster needs a name of its own" .name) -}}
{{- end -}}
{{- $_ := set $names .name true -}}
{{- if .create -}}
{{- $c := include "orchestrator.cluster.created" (list $ .) | fromJson -}}
{{- if hasKey $rayClusters $c.name -}}
{{- fail (printf "clusters[%s]: its RayCluster would be named %s, as %s already is: give the entry another (or a shorter) name" .name $c.name (get $rayClusters $c.name)) -}}
{{- end -}}
{{- $_ := set $rayClusters $c.name (printf "clusters[%s]" .name) -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/*
The volumes the control plane mounts, as {"items": [{volume, claimName, mountPath}, ...]}: the chart's checkpoint
storage and each created cluster's own, at the paths their Ray pods mount them (the control plane checks, archives
into and prunes each run's folder on its cluster's storage: docs/clusters.md, "Storage"), and the code packages'
volume, which no Ray pod mounts. None for an object store.
*/}}
{{- define "orchestrator.controlPlane.storage" -}}
{{- $items := list -}}
{{- $seen := dict -}}
{{- $all := prepend (include "orchestrator.clusters.created" . | fromJson).items (include "orchestrator.cluster.main" . | fromJson) -}}
{{- range $all -}}
{{- if and .claimName (not (hasKey $seen .claimName)) -}}
{{- $_ := set $seen .claimName true -}}
{{- $items = append $items (dict "volume" (printf "storage-%d" (len $items)) "claimName" .claimName "mountPath" .mountPath) -}}
{{- end -}}
{{- end -}}
{{- if not .Values.codeStorage.uri -}}
{{- $items = append $items (dict "volume" "code" "claimName" (include "orchestrator.codeStorage.claimName" .) "mountPath" .Values.codeStorage.mountPath) -}}
{{- end -}}
{{- toJson (dict "items" $items) -}}
{{- end -}}
