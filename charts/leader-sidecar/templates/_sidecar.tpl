{{/*
The sidecar itself, as named templates to include in any pod spec. Each takes the
leader-sidecar chart's context (`.` here, `(index .Subcharts "leader-sidecar")` from a parent).

  spec:
    serviceAccountName: {{ include "leader-sidecar.serviceAccountName" $ls }}
    initContainers:
      {{- include "leader-sidecar.initContainers" $ls | nindent 6 }}
    containers:
      - name: app
        ...
      {{- include "leader-sidecar.containers" $ls | nindent 6 }}
    volumes:
      {{- include "leader-sidecar.volumes" $ls | nindent 6 }}

plus `leader-sidecar.podLabels` in the pod template's labels.
*/}}

{{/* The sidecar as a regular container (renders nothing when nativeSidecar is on). */}}
{{- define "leader-sidecar.containers" -}}
{{- if not .Values.nativeSidecar -}}
{{- include "leader-sidecar.container" . -}}
{{- end -}}
{{- end -}}

{{/* The sidecar as a native sidecar init container (renders nothing when nativeSidecar is off). */}}
{{- define "leader-sidecar.initContainers" -}}
{{- if .Values.nativeSidecar -}}
{{- include "leader-sidecar.container" . -}}
{{- end -}}
{{- end -}}

{{/* One list item: the container. */}}
{{- define "leader-sidecar.container" -}}
- name: {{ .Values.containerName }}
  image: {{ include "leader-sidecar.image" . | quote }}
  imagePullPolicy: {{ .Values.image.pullPolicy }}
  {{- if .Values.nativeSidecar }}
  restartPolicy: Always
  {{- end }}
  {{- with .Values.extraArgs }}
  args:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  env:
    {{- include "leader-sidecar.env" . | nindent 4 }}
  ports:
    - name: sidecar-public
      containerPort: {{ .Values.public.port }}
      protocol: TCP
  {{- with .Values.probes.startup }}
  {{- if .enabled }}
  startupProbe:
    httpGet:
      path: /healthz
      port: sidecar-public
    periodSeconds: {{ .periodSeconds }}
    timeoutSeconds: {{ .timeoutSeconds }}
    failureThreshold: {{ .failureThreshold }}
  {{- end }}
  {{- end }}
  {{- with .Values.probes.liveness }}
  {{- if .enabled }}
  livenessProbe:
    httpGet:
      path: /healthz
      port: sidecar-public
    periodSeconds: {{ .periodSeconds }}
    timeoutSeconds: {{ .timeoutSeconds }}
    failureThreshold: {{ .failureThreshold }}
  {{- end }}
  {{- end }}
  {{- with .Values.probes.readiness }}
  {{- if .enabled }}
  readinessProbe:
    httpGet:
      path: /readyz
      port: sidecar-public
    periodSeconds: {{ .periodSeconds }}
    timeoutSeconds: {{ .timeoutSeconds }}
    failureThreshold: {{ .failureThreshold }}
  {{- end }}
  {{- end }}
  {{- with .Values.resources }}
  resources:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with .Values.securityContext }}
  securityContext:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- $mounts := include "leader-sidecar.volumeMounts" . | trim }}
  {{- if $mounts }}
  volumeMounts:
    {{- $mounts | nindent 4 }}
  {{- end }}
{{- end -}}

{{/* Every setting as LEADER_SIDECAR_<FLAG>; optional ones only when set. */}}
{{- define "leader-sidecar.env" -}}
- name: POD_NAME
  valueFrom:
    fieldRef:
      fieldPath: metadata.name
- name: POD_NAMESPACE
  valueFrom:
    fieldRef:
      fieldPath: metadata.namespace
# The pod's own address, which --app-health-url may name besides loopback.
- name: POD_IP
  valueFrom:
    fieldRef:
      fieldPath: status.podIP
- name: LEADER_SIDECAR_STORE
  value: {{ include "leader-sidecar.storeURL" . | quote }}
- name: LEADER_SIDECAR_LEASE
  value: {{ include "leader-sidecar.leaseNames" . | fromJsonArray | join "," | quote }}
{{- with .Values.lease.shards }}
- name: LEADER_SIDECAR_SHARDS
  value: {{ . | toString | quote }}
{{- end }}
{{- if ne (toString .Values.metrics.perLease) "" }}
- name: LEADER_SIDECAR_METRICS_PER_LEASE
  value: {{ .Values.metrics.perLease | toString | quote }}
{{- end }}
{{- with .Values.lease.group }}
- name: LEADER_SIDECAR_GROUP
  value: {{ . | quote }}
{{- end }}
{{- with .Values.lease.transferTimeout }}
- name: LEADER_SIDECAR_TRANSFER_TIMEOUT
  value: {{ . | toString | quote }}
{{- end }}
{{- with .Values.priority }}
- name: LEADER_SIDECAR_PRIORITY
  value: {{ . | toString | quote }}
{{- end }}
{{- with .Values.revisionLabel }}
# A leader shutting down prefers a successor of another revision: the new pods of a rollout.
- name: LEADER_SIDECAR_REVISION
  valueFrom:
    fieldRef:
      fieldPath: metadata.labels['{{ . }}']
{{- end }}
{{- with .Values.lease.namespace }}
- name: LEADER_SIDECAR_NAMESPACE
  value: {{ . | quote }}
{{- end }}
- name: LEADER_SIDECAR_LEASE_DURATION
  value: {{ .Values.lease.duration | toString | quote }}
{{- with .Values.lease.renewInterval }}
- name: LEADER_SIDECAR_RENEW_INTERVAL
  value: {{ . | toString | quote }}
{{- end }}
{{- with .Values.lease.retryPeriod }}
- name: LEADER_SIDECAR_RETRY_PERIOD
  value: {{ . | toString | quote }}
{{- end }}
{{- with .Values.lease.requestTimeout }}
- name: LEADER_SIDECAR_REQUEST_TIMEOUT
  value: {{ . | toString | quote }}
{{- end }}
{{- with .Values.identity }}
- name: LEADER_SIDECAR_IDENTITY
  value: {{ . | quote }}
{{- end }}
{{- with .Values.limits }}
{{- with .maxConnections }}
- name: LEADER_SIDECAR_MAX_CONNECTIONS
  value: {{ . | toString | quote }}
{{- end }}
{{- with .maxLongPolls }}
- name: LEADER_SIDECAR_MAX_LONG_POLLS
  value: {{ . | toString | quote }}
{{- end }}
{{- with .maxLongPollsPerPeer }}
- name: LEADER_SIDECAR_MAX_LONG_POLLS_PER_PEER
  value: {{ . | toString | quote }}
{{- end }}
{{- with .maxEventStreams }}
- name: LEADER_SIDECAR_MAX_EVENT_STREAMS
  value: {{ . | toString | quote }}
{{- end }}
{{- with .idleTimeout }}
- name: LEADER_SIDECAR_IDLE_TIMEOUT
  value: {{ . | toString | quote }}
{{- end }}
{{- end }}
- name: LEADER_SIDECAR_LISTEN
  value: {{ include "leader-sidecar.hostPort" .Values.api | quote }}
- name: LEADER_SIDECAR_PUBLIC_LISTEN
  value: {{ include "leader-sidecar.hostPort" .Values.public | quote }}
- name: LEADER_SIDECAR_LOG_FORMAT
  value: {{ .Values.log.format | quote }}
- name: LEADER_SIDECAR_LOG_LEVEL
  value: {{ .Values.log.level | quote }}
- name: LEADER_SIDECAR_ROLE_LABEL_KEY
  value: {{ .Values.roleLabel.key | quote }}
{{- with .Values.webhook }}
{{- if .url }}
- name: LEADER_SIDECAR_WEBHOOK_URL
  value: {{ .url | quote }}
- name: LEADER_SIDECAR_WEBHOOK_TIMEOUT
  value: {{ .timeout | toString | quote }}
- name: LEADER_SIDECAR_WEBHOOK_RETRIES
  value: {{ .retries | toString | quote }}
{{- end }}
{{- end }}
{{- with .Values.signal }}
{{- if .process }}
- name: LEADER_SIDECAR_SIGNAL_PROCESS
  value: {{ .process | quote }}
- name: LEADER_SIDECAR_SIGNAL
  value: {{ .name | quote }}
{{- end }}
{{- end }}
{{- with .Values.app }}
{{- if and .health.path .health.port }}
- name: LEADER_SIDECAR_APP_HEALTH_URL
  value: {{ include "leader-sidecar.appHealthURL" $ | quote }}
{{- with .health.period }}
- name: LEADER_SIDECAR_APP_HEALTH_PERIOD
  value: {{ . | toString | quote }}
{{- end }}
{{- with .health.timeout }}
- name: LEADER_SIDECAR_APP_HEALTH_TIMEOUT
  value: {{ . | toString | quote }}
{{- end }}
{{- with .health.failures }}
- name: LEADER_SIDECAR_APP_HEALTH_FAILURES
  value: {{ . | toString | quote }}
{{- end }}
{{- with .health.successes }}
- name: LEADER_SIDECAR_APP_HEALTH_SUCCESSES
  value: {{ . | toString | quote }}
{{- end }}
{{- end }}
{{- with .heartbeat }}
- name: LEADER_SIDECAR_APP_HEARTBEAT
  value: {{ . | toString | quote }}
{{- end }}
{{- /* 0 is a value here (no drain), so "set" is "not the empty string". */}}
{{- if ne (toString .drainTimeout) "" }}
- name: LEADER_SIDECAR_DRAIN_TIMEOUT
  value: {{ .drainTimeout | toString | quote }}
{{- end }}
{{- end }}
{{- if and (eq .Values.store.type "kubernetes") .Values.kubeconfig.existingSecret }}
- name: LEADER_SIDECAR_KUBECONFIG
  value: {{ printf "/etc/leader-sidecar/kubeconfig/%s" .Values.kubeconfig.key | quote }}
{{- end }}
{{- if eq .Values.store.type "zookeeper" }}
{{- with .Values.store.zookeeper }}
{{- if .username }}
- name: LEADER_SIDECAR_ZOOKEEPER_USERNAME
  value: {{ .username | quote }}
- name: LEADER_SIDECAR_ZOOKEEPER_PASSWORD
  valueFrom:
    secretKeyRef:
      name: {{ .existingSecret | quote }}
      key: {{ .existingSecretPasswordKey | quote }}
{{- end }}
{{- if .tls.existingSecret }}
{{- with .tls.caKey }}
- name: LEADER_SIDECAR_ZOOKEEPER_CA_FILE
  value: {{ printf "/etc/leader-sidecar/zookeeper-tls/%s" . | quote }}
{{- end }}
{{- if .tls.certKey }}
- name: LEADER_SIDECAR_ZOOKEEPER_CERT_FILE
  value: {{ printf "/etc/leader-sidecar/zookeeper-tls/%s" .tls.certKey | quote }}
- name: LEADER_SIDECAR_ZOOKEEPER_KEY_FILE
  value: {{ printf "/etc/leader-sidecar/zookeeper-tls/%s" .tls.keyKey | quote }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}
{{- if eq .Values.store.type "redis" }}
{{- with .Values.store.redis }}
{{- with .username }}
- name: LEADER_SIDECAR_REDIS_USERNAME
  value: {{ . | quote }}
{{- end }}
{{- if .existingSecret }}
- name: LEADER_SIDECAR_REDIS_PASSWORD
  valueFrom:
    secretKeyRef:
      name: {{ .existingSecret | quote }}
      key: {{ .existingSecretPasswordKey | quote }}
{{- with .existingSecretSentinelPasswordKey }}
- name: LEADER_SIDECAR_REDIS_SENTINEL_PASSWORD
  valueFrom:
    secretKeyRef:
      name: {{ $.Values.store.redis.existingSecret | quote }}
      key: {{ . | quote }}
{{- end }}
{{- end }}
{{- if .tls.existingSecret }}
{{- with .tls.caKey }}
- name: LEADER_SIDECAR_REDIS_CA_FILE
  value: {{ printf "/etc/leader-sidecar/redis-tls/%s" . | quote }}
{{- end }}
{{- if .tls.certKey }}
- name: LEADER_SIDECAR_REDIS_CERT_FILE
  value: {{ printf "/etc/leader-sidecar/redis-tls/%s" .tls.certKey | quote }}
- name: LEADER_SIDECAR_REDIS_KEY_FILE
  value: {{ printf "/etc/leader-sidecar/redis-tls/%s" .tls.keyKey | quote }}
{{- end }}
{{- end }}
{{- if .minReplicas }}
- name: LEADER_SIDECAR_REDIS_MIN_REPLICAS
  value: {{ .minReplicas | toString | quote }}
{{- end }}
{{- end }}
{{- end }}
{{- if eq .Values.store.type "etcd" }}
{{- with .Values.store.etcd }}
{{- with .username }}
- name: LEADER_SIDECAR_ETCD_USERNAME
  value: {{ . | quote }}
{{- end }}
{{- if .existingSecret }}
- name: LEADER_SIDECAR_ETCD_PASSWORD
  valueFrom:
    secretKeyRef:
      name: {{ .existingSecret | quote }}
      key: {{ .existingSecretPasswordKey | quote }}
{{- end }}
{{- if .tls.existingSecret }}
{{- with .tls.caKey }}
- name: LEADER_SIDECAR_ETCD_CA_FILE
  value: {{ printf "/etc/leader-sidecar/etcd-tls/%s" . | quote }}
{{- end }}
{{- if .tls.certKey }}
- name: LEADER_SIDECAR_ETCD_CERT_FILE
  value: {{ printf "/etc/leader-sidecar/etcd-tls/%s" .tls.certKey | quote }}
- name: LEADER_SIDECAR_ETCD_KEY_FILE
  value: {{ printf "/etc/leader-sidecar/etcd-tls/%s" .tls.keyKey | quote }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}
{{- if and (eq .Values.store.type "postgresql") .Values.store.postgresql.existingSecret }}
- name: PGPASSWORD
  valueFrom:
    secretKeyRef:
      name: {{ .Values.store.postgresql.existingSecret | quote }}
      key: {{ .Values.store.postgresql.existingSecretPasswordKey | quote }}
{{- end }}
{{- with .Values.extraEnv }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{- define "leader-sidecar.volumeMounts" -}}
{{- if and (eq .Values.store.type "redis") .Values.store.redis.tls.existingSecret }}
- name: leader-sidecar-redis-tls
  mountPath: /etc/leader-sidecar/redis-tls
  readOnly: true
{{- end }}
{{- if and (eq .Values.store.type "etcd") .Values.store.etcd.tls.existingSecret }}
- name: leader-sidecar-etcd-tls
  mountPath: /etc/leader-sidecar/etcd-tls
  readOnly: true
{{- end }}
{{- if and (eq .Values.store.type "zookeeper") .Values.store.zookeeper.tls.existingSecret }}
- name: leader-sidecar-zookeeper-tls
  mountPath: /etc/leader-sidecar/zookeeper-tls
  readOnly: true
{{- end }}
{{- if and (eq .Values.store.type "postgresql") .Values.store.postgresql.tlsSecret }}
- name: leader-sidecar-postgresql-tls
  mountPath: /etc/leader-sidecar/postgresql-tls
  readOnly: true
{{- end }}
{{- if and (eq .Values.store.type "kubernetes") .Values.kubeconfig.existingSecret }}
- name: leader-sidecar-kubeconfig
  mountPath: /etc/leader-sidecar/kubeconfig
  readOnly: true
# The Kubernetes client writes a kubeconfig's embedded certificates to temporary files.
- name: leader-sidecar-tmp
  mountPath: /tmp
{{- end }}
{{- if eq .Values.store.type "sqlite" }}
- name: leader-sidecar-data
  mountPath: {{ include "leader-sidecar.dataDir" . }}
{{- end }}
{{- with .Values.extraVolumeMounts }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* leader-sidecar.volumes: list items for your pod's volumes (may render nothing). */}}
{{- define "leader-sidecar.volumes" -}}
{{- include "leader-sidecar.volumeItems" . | trim -}}
{{- end -}}

{{- define "leader-sidecar.volumeItems" -}}
{{- if and (eq .Values.store.type "redis") .Values.store.redis.tls.existingSecret }}
- name: leader-sidecar-redis-tls
  secret:
    secretName: {{ .Values.store.redis.tls.existingSecret | quote }}
    defaultMode: 0444
{{- end }}
{{- if and (eq .Values.store.type "etcd") .Values.store.etcd.tls.existingSecret }}
- name: leader-sidecar-etcd-tls
  secret:
    secretName: {{ .Values.store.etcd.tls.existingSecret | quote }}
    defaultMode: 0444
{{- end }}
{{- if and (eq .Values.store.type "zookeeper") .Values.store.zookeeper.tls.existingSecret }}
- name: leader-sidecar-zookeeper-tls
  secret:
    secretName: {{ .Values.store.zookeeper.tls.existingSecret | quote }}
    defaultMode: 0444
{{- end }}
{{- if and (eq .Values.store.type "postgresql") .Values.store.postgresql.tlsSecret }}
- name: leader-sidecar-postgresql-tls
  secret:
    secretName: {{ .Values.store.postgresql.tlsSecret | quote }}
    # A private key must not be readable by others (libpq refuses it).
    defaultMode: 0400
{{- end }}
{{- if and (eq .Values.store.type "kubernetes") .Values.kubeconfig.existingSecret }}
- name: leader-sidecar-kubeconfig
  secret:
    secretName: {{ .Values.kubeconfig.existingSecret | quote }}
    defaultMode: 0444
- name: leader-sidecar-tmp
  emptyDir:
    medium: Memory
    sizeLimit: 1Mi
{{- end }}
{{- if eq .Values.store.type "sqlite" }}
- name: leader-sidecar-data
  {{- toYaml .Values.store.sqlite.volume | nindent 2 }}
{{- end }}
{{- with .Values.extraVolumes }}
{{ toYaml . }}
{{- end }}
{{- end -}}
