{{/* The chart's name, at most 63 characters. */}}
{{- define "mcpfleet.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The full name: the release's name when it already contains the chart's, else <release>-<chart>. */}}
{{- define "mcpfleet.fullname" -}}
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

{{- define "mcpfleet.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Labels every object carries. */}}
{{- define "mcpfleet.labels" -}}
helm.sh/chart: {{ include "mcpfleet.chart" . }}
{{ include "mcpfleet.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{/* The labels that select the server's pods (never the migration Job's). */}}
{{- define "mcpfleet.selectorLabels" -}}
app.kubernetes.io/name: {{ include "mcpfleet.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: server
{{- end }}

{{/* The admin Service's name: the full name and -admin, within 63 characters. */}}
{{- define "mcpfleet.adminServiceName" -}}
{{- printf "%s-admin" (include "mcpfleet.fullname" . | trunc 57 | trimSuffix "-") }}
{{- end }}

{{/* The labels that select the admin Service (the ServiceMonitor's selector), never the MCP one. */}}
{{- define "mcpfleet.adminServiceSelectorLabels" -}}
{{- include "mcpfleet.selectorLabels" . | replace "app.kubernetes.io/component: server" "app.kubernetes.io/component: admin" }}
{{- end }}

{{- define "mcpfleet.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "mcpfleet.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* The image reference: a digest wins over the tag; the tag defaults to the appVersion. */}}
{{- define "mcpfleet.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}
{{- end }}

{{/* A Secret's name: the reference's, or the chart's full name when it is "". */}}
{{- define "mcpfleet.secretName" -}}
{{- default (include "mcpfleet.fullname" .root) .ref.existingSecret }}
{{- end }}

{{/* The replica count the fleet is sized for: the autoscaler's minimum when one scales it. */}}
{{- define "mcpfleet.minReplicas" -}}
{{- if .Values.autoscaling.enabled }}{{ .Values.autoscaling.minReplicas }}
{{- else if .Values.keda.enabled }}{{ .Values.keda.minReplicas }}
{{- else }}{{ .Values.replicaCount }}
{{- end }}
{{- end }}

{{/* "true" when the cluster serves the custom metrics API (the HPA's Pods metric), else "". */}}
{{- define "mcpfleet.customMetricsApi" -}}
{{- if or (.Capabilities.APIVersions.Has "custom.metrics.k8s.io/v1beta2") (.Capabilities.APIVersions.Has "custom.metrics.k8s.io/v1beta1") }}true{{ end }}
{{- end }}

{{/* "true" when the cluster serves the external metrics API (the HPA's External metric), else "". */}}
{{- define "mcpfleet.externalMetricsApi" -}}
{{- if .Capabilities.APIVersions.Has "external.metrics.k8s.io/v1beta1" }}true{{ end }}
{{- end }}

{{/* terminationGracePeriodSeconds: the drain delay, the shutdown grace and a margin, never kept by hand. */}}
{{- define "mcpfleet.terminationGrace" -}}
{{- add .Values.server.drainDelaySeconds .Values.server.shutdownGraceSeconds .Values.server.terminationGraceMarginSeconds }}
{{- end }}

{{/* The PromQL selector of this release's series (the ServiceMonitor and PodMonitor set job to the full name). */}}
{{- define "mcpfleet.promSelector" -}}
namespace="{{ .Release.Namespace }}",job="{{ include "mcpfleet.fullname" . }}"
{{- end }}

{{/* The host of server.publicUrl. */}}
{{- define "mcpfleet.publicHost" -}}
{{- (urlParse .Values.server.publicUrl).host }}
{{- end }}

{{/* --allowed-hosts: the public URL's host, the ingress host, every DNS name of the Service, and the extra ones. */}}
{{- define "mcpfleet.allowedHosts" -}}
{{- $svc := include "mcpfleet.fullname" . }}
{{- $ns := .Release.Namespace }}
{{- $hosts := list (printf "%s:*" (splitList ":" (include "mcpfleet.publicHost" .) | first)) }}
{{- if .Values.ingress.enabled }}{{ $hosts = append $hosts (printf "%s:*" .Values.ingress.host) }}{{ end }}
{{- range .Values.httpRoute.hostnames }}{{ $hosts = append $hosts (printf "%s:*" .) }}{{ end }}
{{- range (list $svc (printf "%s.%s" $svc $ns) (printf "%s.%s.svc" $svc $ns) (printf "%s.%s.svc.cluster.local" $svc $ns)) }}
{{- $hosts = append $hosts (printf "%s:*" .) }}
{{- end }}
{{- concat $hosts .Values.server.extraAllowedHosts | uniq | join "," }}
{{- end }}

{{/* The security context of every pod (podSecurityContext: restricted, user 65532 unless replaced). */}}
{{- define "mcpfleet.podSecurityContext" -}}
{{- toYaml .Values.podSecurityContext }}
{{- end }}

{{/* The security context of every container (containerSecurityContext: restricted). */}}
{{- define "mcpfleet.containerSecurityContext" -}}
{{- toYaml .Values.containerSecurityContext }}
{{- end }}

{{/* Where PostgreSQL's CA (database.caSecret) is mounted: the URL's sslrootcert names the file in it. */}}
{{- define "mcpfleet.databaseCaDir" -}}
/etc/mcpfleet/database-ca
{{- end }}

{{/* The database CA's volume mount, for every container that connects to PostgreSQL (none without caSecret). */}}
{{- define "mcpfleet.databaseCaMount" -}}
{{- if .Values.database.caSecret.existingSecret -}}
- name: database-ca
  mountPath: {{ include "mcpfleet.databaseCaDir" . }}
  readOnly: true
{{- end }}
{{- end }}

{{/* The database CA's volume (none without caSecret). */}}
{{- define "mcpfleet.databaseCaVolume" -}}
{{- with .Values.database.caSecret }}
{{- if .existingSecret -}}
- name: database-ca
  secret:
    secretName: {{ .existingSecret }}
    items:
      - key: {{ .key }}
        path: {{ .key }}
{{- end }}
{{- end }}
{{- end }}

{{/* The audit verification CronJob's name: a CronJob's name has at most 52 characters (its Jobs add 11). */}}
{{- define "mcpfleet.auditVerifyName" -}}
{{- printf "%s-audit-verify" (include "mcpfleet.fullname" . | trunc 39 | trimSuffix "-") }}
{{- end }}

{{/* An alert's labels: its own (.labels), then metrics.prometheusRule.alerts.<.name>.additionalLabels over them. */}}
{{- define "mcpfleet.alertLabels" -}}
{{- $settings := index .root.Values.metrics.prometheusRule.alerts .name }}
{{- toYaml (mergeOverwrite (deepCopy .labels) (deepCopy ($settings.additionalLabels | default dict))) }}
{{- end }}

{{/* --worker-threads: resources.requests.cpu rounded up (at least 1, at most 256), or "" (no flag). Only without a CPU
     limit: with one, the runtime's default, one thread per CPU the process may use, already follows the cgroup's
     quota (Rust's available_parallelism reads it); without one, that default is every CPU of the node, e.g. 64
     threads contending for the half core the pod asked for. Not when server.extraArgs gives the flag. */}}
{{- define "mcpfleet.workerThreads" -}}
{{- $req := toString (dig "requests" "cpu" "" .Values.resources) }}
{{- $lim := toString (dig "limits" "cpu" "" .Values.resources) }}
{{- $given := false }}
{{- range .Values.server.extraArgs }}{{ if or (eq . "--worker-threads") (hasPrefix "--worker-threads=" .) }}{{ $given = true }}{{ end }}{{ end }}
{{- if and $req (not $lim) (not $given) }}
{{- $n := 0 }}
{{- if hasSuffix "m" $req }}
{{- $n = div (add (atoi (trimSuffix "m" $req)) 999) 1000 }}
{{- else }}
{{- $n = int (ceil (float64 $req)) }}
{{- end }}
{{- max 1 (min 256 $n) }}
{{- end }}
{{- end }}

{{/* "true" when KEDA's Redis triggers have credentials to carry (a user, a password or a CA), else "". */}}
{{- define "mcpfleet.kedaRedisAuth" -}}
{{- $r := .Values.redis }}
{{- if or $r.username $r.passwordSecret.existingSecret $r.caSecret.existingSecret }}true{{ end }}
{{- end }}

{{- define "mcpfleet.kedaRedisAuthName" -}}
{{- printf "%s-redis" (include "mcpfleet.fullname" . | trunc 57 | trimSuffix "-") }}
{{- end }}

{{/* The Redis flags of every process that reaches the fleet's Redis: the replicas and the policy Job. */}}
{{- define "mcpfleet.redisArgs" -}}
{{- $v := .Values -}}
- {{ print "--redis-mode=" $v.redis.mode | quote }}
{{- if ne $v.redis.mode "standalone" }}
- {{ print "--redis-nodes=" (join "," $v.redis.nodes) | quote }}
{{- end }}
{{- if eq $v.redis.mode "sentinel" }}
- {{ print "--redis-sentinel-master=" $v.redis.sentinelMaster | quote }}
{{- end }}
{{- if and $v.redis.tls (ne $v.redis.mode "standalone") }}
- --redis-tls
{{- end }}
{{- if $v.redis.caSecret.existingSecret }}
- --redis-ca-file=/etc/mcpfleet/redis-ca/{{ $v.redis.caSecret.key }}
{{- end }}
- {{ print "--redis-prefix=" $v.redis.prefix | quote }}
- {{ print "--redis-timeout=" $v.redis.timeout | quote }}
{{- if not (kindIs "invalid" $v.redis.durableReplicas) }}
- {{ print "--redis-durable-replicas=" (int64 $v.redis.durableReplicas) | quote }}
{{- end }}
{{- end }}

{{/* The Redis credentials in the environment, for the replicas and the policy Job. */}}
{{- define "mcpfleet.redisEnv" -}}
{{- $v := .Values -}}
{{- if eq $v.redis.mode "standalone" }}
- name: MCPFLEET_REDIS_URL
  valueFrom:
    secretKeyRef:
      name: {{ include "mcpfleet.secretName" (dict "root" . "ref" $v.redis.urlSecret) }}
      key: {{ $v.redis.urlSecret.key }}
{{- end }}
{{- with $v.redis.username }}
# The ACL user (--redis-username), in the environment, where KEDA's TriggerAuthentication reads it too.
- name: MCPFLEET_REDIS_USERNAME
  value: {{ . | quote }}
{{- end }}
{{- if $v.redis.passwordSecret.existingSecret }}
- name: MCPFLEET_REDIS_PASSWORD
  valueFrom:
    secretKeyRef:
      name: {{ $v.redis.passwordSecret.existingSecret }}
      key: {{ $v.redis.passwordSecret.key }}
{{- end }}
{{- end }}
