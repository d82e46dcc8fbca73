{{/*
Checks of value combinations that values.schema.json cannot express with a useful message.
Each failure names the value, what is wrong and the fix. Rendered by validate.yaml, so it runs
whether the chart is installed on its own or as a dependency.
*/}}
{{- define "leader-sidecar.validate" -}}
{{- $v := .Values -}}
{{- $type := $v.store.type -}}

{{- if and (eq $type "postgresql") (not $v.store.postgresql.url) -}}
{{- fail "leader-sidecar: store.postgresql.url is required with store.type=postgresql, e.g. postgresql://sidecar@db:5432/app?sslmode=verify-full (password in store.postgresql.existingSecret)" -}}
{{- end -}}
{{- if and (eq $type "postgresql") (or (regexMatch "^[a-z]+://[^/@]*:[^/@]*@" $v.store.postgresql.url) (regexMatch "[?&](ssl)?password=" $v.store.postgresql.url)) -}}
{{- fail "leader-sidecar: store.postgresql.url must not contain a password (it would be stored in the release and shown in the pod spec); put it in a Secret and set store.postgresql.existingSecret" -}}
{{- end -}}
{{- if and (eq $type "redis") (not $v.store.redis.url) -}}
{{- fail "leader-sidecar: store.redis.url is required with store.type=redis, e.g. redis://redis-master:6379/0 (password in store.redis.existingSecret)" -}}
{{- end -}}

{{- if and (eq $type "redis") (regexMatch "^[a-z+]+://[^/@]*:[^/@]*@" $v.store.redis.url) -}}
{{- fail "leader-sidecar: store.redis.url must not contain a password (it would be stored in the release and shown in the pod spec); put it in a Secret and set store.redis.existingSecret" -}}
{{- end -}}

{{- if and (eq $type "redis") $v.store.redis.existingSecretSentinelPasswordKey -}}
{{- if not $v.store.redis.existingSecret -}}
{{- fail "leader-sidecar: store.redis.existingSecretSentinelPasswordKey names a key of store.redis.existingSecret; set that Secret's name" -}}
{{- end -}}
{{- if not (hasPrefix "redis+sentinel://" $v.store.redis.url) -}}
{{- fail "leader-sidecar: store.redis.existingSecretSentinelPasswordKey is the Sentinels' password and needs a redis+sentinel:// store.redis.url" -}}
{{- end -}}
{{- end -}}

{{- if and (eq $type "redis") $v.store.redis.tls.certKey (not $v.store.redis.tls.keyKey) -}}
{{- fail "leader-sidecar: store.redis.tls.certKey and store.redis.tls.keyKey go together; set both or neither" -}}
{{- end -}}
{{- if and (eq $type "redis") $v.store.redis.tls.keyKey (not $v.store.redis.tls.certKey) -}}
{{- fail "leader-sidecar: store.redis.tls.certKey and store.redis.tls.keyKey go together; set both or neither" -}}
{{- end -}}
{{- if and (eq $type "redis") (or $v.store.redis.tls.certKey (ne $v.store.redis.tls.caKey "ca.crt")) (not $v.store.redis.tls.existingSecret) -}}
{{- fail "leader-sidecar: store.redis.tls.* keys name entries of store.redis.tls.existingSecret; set that Secret's name" -}}
{{- end -}}

{{- if and (eq $type "etcd") (not $v.store.etcd.endpoints) -}}
{{- fail "leader-sidecar: store.etcd.endpoints is required with store.type=etcd, e.g. etcd://etcd-0.etcd:2379,etcd-1.etcd:2379,etcd-2.etcd:2379 (password in store.etcd.existingSecret)" -}}
{{- end -}}
{{- if and (eq $type "etcd") (regexMatch "^[a-z]+://[^/@]*:[^/@]*@" $v.store.etcd.endpoints) -}}
{{- fail "leader-sidecar: store.etcd.endpoints must not contain a password (it would be stored in the release and shown in the pod spec); put it in a Secret and set store.etcd.existingSecret" -}}
{{- end -}}
{{- if and (eq $type "etcd") (or $v.store.etcd.tls.certKey $v.store.etcd.tls.keyKey) (not (and $v.store.etcd.tls.certKey $v.store.etcd.tls.keyKey)) -}}
{{- fail "leader-sidecar: store.etcd.tls.certKey and store.etcd.tls.keyKey go together; set both or neither" -}}
{{- end -}}
{{- if and (eq $type "etcd") (or $v.store.etcd.tls.certKey (ne $v.store.etcd.tls.caKey "ca.crt")) (not $v.store.etcd.tls.existingSecret) -}}
{{- fail "leader-sidecar: store.etcd.tls.* keys name entries of store.etcd.tls.existingSecret; set that Secret's name" -}}
{{- end -}}
{{- if and (eq $type "etcd") $v.store.etcd.tls.existingSecret (not (hasPrefix "etcds://" $v.store.etcd.endpoints)) -}}
{{- fail "leader-sidecar: store.etcd.tls.existingSecret needs an etcds:// store.etcd.endpoints (TLS)" -}}
{{- end -}}

{{- if and (eq $type "zookeeper") (not $v.store.zookeeper.connectString) -}}
{{- fail "leader-sidecar: store.zookeeper.connectString is required with store.type=zookeeper, e.g. zk-0.zk:2181,zk-1.zk:2181,zk-2.zk:2181 (chroot in store.zookeeper.chroot, password in store.zookeeper.existingSecret)" -}}
{{- end -}}
{{- if and (eq $type "zookeeper") $v.store.zookeeper.username (not $v.store.zookeeper.existingSecret) -}}
{{- fail "leader-sidecar: store.zookeeper.username needs its password from a Secret; set store.zookeeper.existingSecret (the password is never a value)" -}}
{{- end -}}
{{- if and (eq $type "zookeeper") (or $v.store.zookeeper.tls.certKey $v.store.zookeeper.tls.keyKey) (not (and $v.store.zookeeper.tls.certKey $v.store.zookeeper.tls.keyKey)) -}}
{{- fail "leader-sidecar: store.zookeeper.tls.certKey and store.zookeeper.tls.keyKey go together; set both or neither" -}}
{{- end -}}
{{- if and (eq $type "zookeeper") (or $v.store.zookeeper.tls.certKey (ne $v.store.zookeeper.tls.caKey "ca.crt")) (not $v.store.zookeeper.tls.existingSecret) -}}
{{- fail "leader-sidecar: store.zookeeper.tls.* keys name entries of store.zookeeper.tls.existingSecret; set that Secret's name" -}}
{{- end -}}
{{- if and (eq $type "zookeeper") $v.store.zookeeper.existingSecret (not $v.store.zookeeper.username) -}}
{{- fail "leader-sidecar: store.zookeeper.existingSecret holds a digest user's password; set store.zookeeper.username too" -}}
{{- end -}}

{{- if eq $type "sqlite" -}}
{{- if not $v.store.sqlite.volume -}}
{{- fail "leader-sidecar: store.sqlite.volume is required with store.type=sqlite: a volume every replica shares on ONE node, e.g. {hostPath: {path: /var/lib/leader-sidecar, type: DirectoryOrCreate}}; for more than one node use store.type=kubernetes or redis" -}}
{{- end -}}
{{- if hasKey $v.store.sqlite.volume "emptyDir" -}}
{{- fail "leader-sidecar: store.sqlite.volume must not be an emptyDir: each pod would get its own database and every pod would become leader; use a hostPath or a claim shared by all replicas on one node" -}}
{{- end -}}
{{- end -}}

{{- if and $v.lease.name $v.lease.names -}}
{{- fail "leader-sidecar: lease.name and lease.names are both set; use lease.names for several leases or lease.name for one, not both" -}}
{{- end -}}

{{- $names := include "leader-sidecar.leaseNames" . | fromJsonArray -}}
{{- $total := mul (len $names) (max 1 ($v.lease.shards | int)) -}}
{{- if gt $total 10000 -}}
{{- fail (printf "leader-sidecar: lease.names (%d) times lease.shards (%v) makes %d leases; one sidecar runs at most 10000: use fewer shards or names, or split them over several releases" (len $names) $v.lease.shards $total) -}}
{{- end -}}

{{- $candidates := include "leader-sidecar.candidatesLease" . -}}
{{- if and (eq $type "kubernetes") (has $candidates (include "leader-sidecar.leases" . | fromJsonArray)) -}}
{{- fail (printf "leader-sidecar: the kubernetes store keeps the candidates in the Lease %s, which is also one of the leases; rename that lease or set lease.group to another name" $candidates) -}}
{{- end -}}

{{- $several := include "leader-sidecar.severalLeases" . -}}
{{- if and $v.leaderService.enabled (not $several) -}}
{{- if ne $type "kubernetes" -}}
{{- fail (printf "leader-sidecar: leaderService.enabled selects pods by the role label, which only store.type=kubernetes sets; with store.type=%s set leaderService.enabled=false" $type) -}}
{{- end -}}
{{- if not $v.roleLabel.key -}}
{{- fail "leader-sidecar: leaderService.enabled needs roleLabel.key (it selects <roleLabel.key>=leader); set leaderService.enabled=false to run without pod labels" -}}
{{- end -}}
{{- end -}}

{{- if and $v.metrics.podMonitor.enabled $v.metrics.serviceMonitor.enabled -}}
{{- fail "leader-sidecar: metrics.podMonitor.enabled and metrics.serviceMonitor.enabled would scrape every pod twice; enable one" -}}
{{- end -}}

{{- if and $v.nativeSidecar (not (semverCompare ">=1.29.0-0" .Capabilities.KubeVersion.Version)) -}}
{{- fail (printf "leader-sidecar: nativeSidecar=true needs Kubernetes 1.29 or later (init containers with restartPolicy: Always); this cluster is %s, set nativeSidecar=false" .Capabilities.KubeVersion.Version) -}}
{{- end -}}

{{- if and (eq $type "kubernetes") $v.rbac.create (not $v.serviceAccount.create) (not $v.serviceAccount.name) -}}
{{- fail "leader-sidecar: with serviceAccount.create=false set serviceAccount.name to the ServiceAccount your pods use; the chart will not grant lease rights to the namespace's default account" -}}
{{- end -}}

{{- with $v.app -}}
{{- if and .health.path (not .health.port) -}}
{{- fail "leader-sidecar: app.health.path needs app.health.port (the sidecar checks http://127.0.0.1:<port><path>); set both or neither" -}}
{{- end -}}
{{- if and .health.port (not .health.path) -}}
{{- fail "leader-sidecar: app.health.port needs app.health.path (the sidecar checks http://127.0.0.1:<port><path>); set both or neither" -}}
{{- end -}}
{{- if and .health.port (has (int .health.port) (list (int $v.api.port) (int $v.public.port))) -}}
{{- fail (printf "leader-sidecar: app.health.port %v is the sidecar's own (api.port or public.port); set the port of the app's health endpoint" .health.port) -}}
{{- end -}}
{{- if not .health.path -}}
{{- range $key := list "period" "timeout" "failures" "successes" -}}
{{- if ne (toString (index $v.app.health $key)) "" -}}
{{- fail (printf "leader-sidecar: app.health.%s applies only with app.health.path and app.health.port (the sidecar refuses --app-health-%s without --app-health-url); set those or leave app.health.%s empty" $key $key $key) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- if and (ne (toString .drainTimeout) "") (not (include "leader-sidecar.appCheck" $)) -}}
{{- fail "leader-sidecar: app.drainTimeout needs app.health.path and app.health.port, or app.heartbeat: without an app check the sidecar cannot tell when the app has stopped, and refuses a --drain-timeout above 0 (0 changes nothing); set one or leave app.drainTimeout empty" -}}
{{- end -}}
{{- end -}}

{{- if and (eq (int $v.api.port) (int $v.public.port)) (ne (int $v.api.port) 0) -}}
{{- fail (printf "leader-sidecar: api.port and public.port are both %v; the localhost API and the public listener need different ports" $v.api.port) -}}
{{- end -}}

{{- end -}}
