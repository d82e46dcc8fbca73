{{/*
Names, labels and derived settings. Every template here takes the leader-sidecar chart's own
context: `.` inside this chart, `(index .Subcharts "leader-sidecar")` from a parent chart
(use the alias instead of "leader-sidecar" if the dependency has one).
*/}}

{{- define "leader-sidecar.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "leader-sidecar.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/*
The name of an object the chart makes beside the full name: the full name plus a suffix
("-leader"), the full name cut (`trunc | trimSuffix "-"`) so that the whole stays within 63
characters, the limit of a Service name (a DNS label) and of a label value, whatever
fullnameOverride says. Call with (list $context "-leader").
*/}}
{{- define "leader-sidecar.suffixedName" -}}
{{- $suffix := index . 1 -}}
{{- $base := include "leader-sidecar.fullname" (index . 0) | trunc (int (sub 63 (len $suffix))) | trimSuffix "-" -}}
{{- printf "%s%s" $base $suffix -}}
{{- end -}}

{{- define "leader-sidecar.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Labels of the objects this chart creates (not of your pods). */}}
{{- define "leader-sidecar.labels" -}}
helm.sh/chart: {{ include "leader-sidecar.chart" . }}
app.kubernetes.io/name: {{ include "leader-sidecar.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{- define "leader-sidecar.selectorLabels" -}}
app.kubernetes.io/name: {{ include "leader-sidecar.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{/* The lease name: also a label value, hence at most 63 characters (the schema checks). */}}
{{- define "leader-sidecar.leaseName" -}}
{{- .Values.lease.name | default (include "leader-sidecar.fullname" .) -}}
{{- end -}}

{{/*
The configured lease names, before shards: lease.names, else the one lease.name (or the
release's full name). A JSON list: `include "leader-sidecar.leaseNames" . | fromJsonArray`.
*/}}
{{- define "leader-sidecar.leaseNames" -}}
{{- if .Values.lease.names -}}
{{- toJson .Values.lease.names -}}
{{- else -}}
{{- list (include "leader-sidecar.leaseName" .) | toJson -}}
{{- end -}}
{{- end -}}

{{/*
Every lease the sidecar runs, shards expanded as the sidecar's --shards expands them (each name
in turn: <name>-0 … <name>-(N-1)). A JSON list.
*/}}
{{- define "leader-sidecar.leases" -}}
{{- $names := include "leader-sidecar.leaseNames" . | fromJsonArray -}}
{{- $shards := .Values.lease.shards | int -}}
{{- if $shards -}}
{{- /* Written out and split, not appended one by one: append copies the list every time,
which makes 10,000 shards take seconds. */ -}}
{{- $joined := include "leader-sidecar.shardsJoined" (dict "names" $names "shards" $shards) -}}
{{- splitList "," $joined | toJson -}}
{{- else -}}
{{- toJson $names -}}
{{- end -}}
{{- end -}}

{{- define "leader-sidecar.shardsJoined" -}}
{{- $shards := .shards -}}
{{- range $k, $name := .names -}}
{{- range $i := until $shards -}}
{{- if or $k $i -}},{{- end -}}{{ $name }}-{{ $i }}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* "true" when the sidecar runs more than one lease (then it manages no role label). */}}
{{- define "leader-sidecar.severalLeases" -}}
{{- if gt (len (include "leader-sidecar.leases" . | fromJsonArray)) 1 -}}true{{- end -}}
{{- end -}}

{{/* --group: the candidates sharing the leases; default the first configured name, as the
sidecar defaults it. Also the pods' leader-sidecar/lease label value (<= 63 characters). */}}
{{- define "leader-sidecar.group" -}}
{{- .Values.lease.group | default (first (include "leader-sidecar.leaseNames" . | fromJsonArray)) -}}
{{- end -}}

{{/* The Lease in which the kubernetes store keeps the group's candidate records (one
annotation per replica, merge-patched; get and patch by name only). */}}
{{- define "leader-sidecar.candidatesLease" -}}
{{- printf "%s-candidates" (include "leader-sidecar.group" .) -}}
{{- end -}}


{{/* Namespace of the Lease object: the pods' namespace unless lease.namespace says otherwise. */}}
{{- define "leader-sidecar.leaseNamespace" -}}
{{- .Values.lease.namespace | default .Release.Namespace -}}
{{- end -}}

{{/*
leader-sidecar.podLabels: put these on your pod template's metadata.labels. They tie the pod
to its lease group (lease.group, by default the first lease name), which the leader Service,
the metrics Service and the PodMonitor select.
*/}}
{{- define "leader-sidecar.podLabels" -}}
leader-sidecar/lease: {{ include "leader-sidecar.group" . | quote }}
{{- end -}}

{{/* Labels selecting the pods of the lease group (podSelector, else the podLabels). */}}
{{- define "leader-sidecar.podSelector" -}}
{{- if .Values.podSelector -}}
{{- toYaml .Values.podSelector -}}
{{- else -}}
{{- include "leader-sidecar.podLabels" . -}}
{{- end -}}
{{- end -}}

{{/* leader-sidecar.serviceAccountName: use it as your pod's serviceAccountName. */}}
{{- define "leader-sidecar.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- .Values.serviceAccount.name | default (include "leader-sidecar.fullname" .) -}}
{{- else -}}
{{- .Values.serviceAccount.name | default "default" -}}
{{- end -}}
{{- end -}}

{{- define "leader-sidecar.image" -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion | toString) -}}
{{- end -}}
{{- end -}}

{{/* HOST:PORT for --listen / --public-listen; IPv6 hosts go in brackets. */}}
{{- define "leader-sidecar.hostPort" -}}
{{- if contains ":" .host -}}
{{- printf "[%s]:%v" .host .port -}}
{{- else -}}
{{- printf "%s:%v" .host .port -}}
{{- end -}}
{{- end -}}

{{/* Where the embedded store's file lives in the container. */}}
{{- define "leader-sidecar.dataDir" -}}
/var/lib/leader-sidecar
{{- end -}}

{{/* --store */}}
{{- define "leader-sidecar.storeURL" -}}
{{- if eq .Values.store.type "redis" -}}
{{- .Values.store.redis.url -}}
{{- else if eq .Values.store.type "etcd" -}}
{{- .Values.store.etcd.endpoints -}}
{{- else if eq .Values.store.type "postgresql" -}}
{{- .Values.store.postgresql.url -}}
{{- else if eq .Values.store.type "zookeeper" -}}
{{- with .Values.store.zookeeper -}}
{{- /* The digest user and its password are variables of their own (leader-sidecar.env). */ -}}
{{- printf "%s://%s%s" (ternary "zookeepers" "zookeeper" (not (empty .tls.existingSecret))) .connectString .chroot -}}
{{- end -}}
{{- else if eq .Values.store.type "sqlite" -}}
{{- printf "sqlite:///%s/%s" (include "leader-sidecar.dataDir" .) .Values.store.sqlite.file -}}
{{- else -}}
kubernetes
{{- end -}}
{{- end -}}

{{/* --app-health-url: the app's health endpoint on loopback ("" without app.health.path). */}}
{{- define "leader-sidecar.appHealthURL" -}}
{{- with .Values.app.health -}}
{{- if and .path .port -}}
{{- printf "http://127.0.0.1:%d%s" (int .port) .path -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* "true" when the sidecar checks its app (a health URL or a heartbeat), else "". */}}
{{- define "leader-sidecar.appCheck" -}}
{{- if or (include "leader-sidecar.appHealthURL" .) .Values.app.heartbeat -}}
true
{{- end -}}
{{- end -}}

{{/*
A duration value (15, 1.5, "1500ms", "2s", "1m", "1h"; values.schema.json's format) in
seconds, as a string.
*/}}
{{- define "leader-sidecar.seconds" -}}
{{- $text := toString . -}}
{{- $number := regexReplaceAll "(ms|s|m|h)$" $text "" -}}
{{- $unit := trimPrefix $number $text -}}
{{- $scale := get (dict "" 1.0 "s" 1.0 "ms" 0.001 "m" 60.0 "h" 3600.0) $unit -}}
{{- mulf (float64 $number) $scale -}}
{{- end -}}

{{/*
Seconds the sidecar may spend draining on SIGTERM (--drain-timeout, default the lease duration
with an app check), "0" without an app check.
*/}}
{{- define "leader-sidecar.drainSeconds" -}}
{{- if include "leader-sidecar.appCheck" . -}}
{{- $drain := .Values.app.drainTimeout -}}
{{- if eq (toString $drain) "" -}}
{{- $drain = .Values.lease.duration -}}
{{- end -}}
{{- include "leader-sidecar.seconds" $drain -}}
{{- else -}}
0
{{- end -}}
{{- end -}}

{{/*
Seconds after the app stops before its check says so (the sidecar's AppCheckSettings.down_within):
failures x period + timeout with a health URL, the heartbeat with one; the longer.
*/}}
{{- define "leader-sidecar.appDownWithin" -}}
{{- $within := 0.0 -}}
{{- with .Values.app -}}
{{- if include "leader-sidecar.appHealthURL" $ -}}
{{- $period := include "leader-sidecar.seconds" (.health.period | default 1) | float64 -}}
{{- $timeout := include "leader-sidecar.seconds" (.health.timeout | default 1) | float64 -}}
{{- $within = addf (mulf (.health.failures | default 3 | float64) $period) $timeout -}}
{{- end -}}
{{- with .heartbeat -}}
{{- $within = maxf $within (include "leader-sidecar.seconds" . | float64) -}}
{{- end -}}
{{- end -}}
{{- $within -}}
{{- end -}}

{{/*
Whole seconds the example pod needs to stop: the sidecar's up to 2 s hand-over after its drain.
Without nativeSidecar the app and the sidecar get SIGTERM together and the drain may last
drainSeconds; with it the app (which exits on SIGTERM) has stopped first, so the drain lasts
until the check sees that: at most appDownWithin.
*/}}
{{- define "leader-sidecar.exampleStopSeconds" -}}
{{- $drain := include "leader-sidecar.drainSeconds" . | float64 -}}
{{- if .Values.nativeSidecar -}}
{{- $drain = minf $drain (include "leader-sidecar.appDownWithin" . | float64) -}}
{{- end -}}
{{- add (ceil $drain | int) 2 -}}
{{- end -}}
