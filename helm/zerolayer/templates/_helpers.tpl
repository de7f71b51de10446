{{/* Names and labels. */}}
{{- define "zl.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* At most 39 characters: the longest name made from it, the orchestrator StatefulSet's (+13), must leave room
for the controller-revision-hash label its pods get (name + 11, at most 63). */}}
{{- define "zl.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 39 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 39 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 39 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "zl.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
app.kubernetes.io/name: {{ include "zl.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{/* Selector labels of one tier: (dict "root" $ "tier" "orchestrator"). */}}
{{- define "zl.selector" -}}
app.kubernetes.io/name: {{ include "zl.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .tier }}
{{- end -}}

{{- define "zl.image" -}}
{{ include "zl.imageFor" (dict "root" .) }}
{{- end -}}

{{- define "zl.orchestrator" -}}{{ include "zl.fullname" . }}-orchestrator{{- end -}}
{{- define "zl.peers" -}}{{ include "zl.fullname" . }}-orchestrator-peers{{- end -}}
{{- define "zl.frontend" -}}{{ include "zl.fullname" . }}-frontend{{- end -}}

{{/* The orchestrators' stable names: pod.headless-service.namespace.svc.domain. */}}
{{- define "zl.orchestratorHost" -}}
{{ include "zl.orchestrator" .root }}-{{ .i }}.{{ include "zl.peers" .root }}.{{ .root.Release.Namespace }}.svc.{{ .root.Values.clusterDomain }}
{{- end -}}

{{/* --raft-peers: id@host:admin-port for every orchestrator. */}}
{{- define "zl.raftPeers" -}}
{{- $root := . -}}
{{- $peers := list -}}
{{- range $i := until (int .Values.orchestrator.replicas) -}}
{{- $peers = append $peers (printf "%d@%s:7001" (add $i 1) (include "zl.orchestratorHost" (dict "root" $root "i" $i))) -}}
{{- end -}}
{{- join "," $peers -}}
{{- end -}}

{{/* The orchestrators' QUIC addresses, for static discovery. */}}
{{- define "zl.orchestratorAddrs" -}}
{{- $root := . -}}
{{- $addrs := list -}}
{{- range $i := until (int .Values.orchestrator.replicas) -}}
{{- $addrs = append $addrs (printf "%s:7000" (include "zl.orchestratorHost" (dict "root" $root "i" $i))) -}}
{{- end -}}
{{- toJson $addrs -}}
{{- end -}}

{{/* What every pod runs as: non-root, read-only root file system, no capabilities. */}}
{{- define "zl.podSecurity" -}}
runAsNonRoot: true
runAsUser: 65532
runAsGroup: 65532
fsGroup: 65532
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{- define "zl.containerSecurity" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
capabilities:
  drop: [ALL]
{{- end -}}

{{/* Environment every tier shares: its node id is its pod name. */}}
{{- define "zl.env" -}}
- name: ZL_NODE_ID
  valueFrom:
    fieldRef:
      fieldPath: metadata.name
- name: POD_IP
  valueFrom:
    fieldRef:
      fieldPath: status.podIP
- name: ZL_TLS_DIR
  value: /etc/zerolayer/tls
- name: ZL_CONFIG
  value: /etc/zerolayer/config/config.toml
- name: ZL_REGION
  value: {{ .Values.region | quote }}
{{- with .Values.otlp.endpoint }}
- name: ZL_OTLP_ENDPOINT
  value: {{ . | quote }}
{{- end }}
{{- if eq .Values.discovery.backend "consul" }}
{{- if .Values.discovery.consul.useHostIP }}
- name: HOST_IP
  valueFrom:
    fieldRef:
      fieldPath: status.hostIP
- name: ZL_CONSUL_ADDR
  value: "$(HOST_IP):{{ .Values.discovery.consul.port }}"
{{- else }}
- name: ZL_CONSUL_ADDR
  value: {{ .Values.discovery.consul.address | quote }}
{{- end }}
{{- if .Values.discovery.consul.tokenSecret }}
- name: ZL_CONSUL_TOKEN_FILE
  value: /etc/zerolayer/consul/token
{{- end }}
{{- end }}
{{- end -}}

{{/* Discovery settings of a config file (TOML). */}}
{{- define "zl.discoveryConfig" -}}
{{- if eq .Values.discovery.backend "consul" }}
discovery = "consul"
consul-ttl-ms = {{ .Values.discovery.consul.ttlMs }}
{{- end }}
{{- end -}}

{{/* Volumes every tier mounts: its TLS files, its config, a writable /tmp; Consul's token when used; a worker's
     or frontend's identity directory; the CA key an orchestrator signs enrollments with (without cert-manager).
     (dict "root" $ "tier" "worker" "config" "worker-cpu"). The TLS files are laid out as `zl certs` writes them:
     ca.pem and {role}-{node}.pem/.key (orchestrators), bootstrap-{role}.pem/.key (workers and frontends, which
     enroll for a certificate of their own), or, with cert-manager, each worker's and frontend's own certificate
     from the CSI driver as node.pem/.key (docs/kubernetes.md, "Node identity"). */}}
{{- define "zl.volumes" -}}
{{- $root := .root -}}
{{- $full := include "zl.fullname" .root -}}
- name: tls
{{- if and .root.Values.tls.certManager.enabled (ne .tier "orchestrator") }}
{{- $cm := .root.Values.tls.certManager }}
{{- $issuer := $cm.nodeIssuerRef | default (dict "name" (printf "%s-nodes" $full) "kind" "Issuer") }}
  csi:
    driver: csi.cert-manager.io
    readOnly: true
    volumeAttributes:
      csi.cert-manager.io/issuer-name: {{ $issuer.name }}
      csi.cert-manager.io/issuer-kind: {{ $issuer.kind | default "Issuer" }}
      {{- with $issuer.group }}
      csi.cert-manager.io/issuer-group: {{ . }}
      {{- end }}
      csi.cert-manager.io/common-name: "${POD_NAME}.{{ .tier }}.zl.internal"
      csi.cert-manager.io/dns-names: "{{ .tier }}.zl.internal,${POD_NAME}.{{ .tier }}.zl.internal"
      csi.cert-manager.io/key-usages: "digital signature,server auth,client auth"
      csi.cert-manager.io/key-encoding: PKCS8
      csi.cert-manager.io/duration: {{ $cm.duration | quote }}
      csi.cert-manager.io/renew-before: {{ $cm.renewBefore | quote }}
      csi.cert-manager.io/ca-file: ca.pem
      csi.cert-manager.io/certificate-file: node.pem
      csi.cert-manager.io/privatekey-file: node.key
{{- else if .root.Values.tls.certManager.enabled }}
  projected:
    defaultMode: 0440
    sources:
{{- if eq .tier "orchestrator" }}
{{- range $i := until (int $root.Values.orchestrator.replicas) }}
      - secret:
          name: {{ $full }}-tls-orchestrator-{{ $i }}
          items:
            - {key: tls.crt, path: orchestrator-{{ $full }}-orchestrator-{{ $i }}.pem}
            - {key: tls.key, path: orchestrator-{{ $full }}-orchestrator-{{ $i }}.key}
{{- if eq $i 0 }}
            - {key: ca.crt, path: ca.pem}
{{- end }}
{{- end }}
{{- end }}
{{- else }}
  secret:
    secretName: {{ $full }}-tls-{{ .tier }}
    defaultMode: 0440
{{- end }}
- name: config
  configMap:
    name: {{ $full }}-{{ .config }}
- name: tmp
  emptyDir: {}
{{- if and (ne .tier "orchestrator") (not (and (eq .tier "frontend") (include "zl.frontendPersistent" .root))) }}
# The certificate this pod enrolled for (kept across container restarts; a new pod enrolls anew).
- name: identity
  emptyDir: {medium: Memory, sizeLimit: 1Mi}
{{- else if not .root.Values.tls.certManager.enabled }}
# The cluster CA's key, to sign the certificates workers and frontends enroll for.
- name: enroll-ca
  secret:
    secretName: {{ $full }}-ca
    defaultMode: 0400
    items:
      - {key: ca.key, path: ca.key}
{{- end }}
{{- if ne .tier "worker" }}
# The pepper key secrets are stored keyed with (orchestrators and frontends only).
- name: key-pepper
  secret:
    secretName: {{ .root.Values.keyPepper.existingSecret | default (printf "%s-key-pepper" $full) }}
    defaultMode: 0400
{{- end }}
{{- if and (eq .root.Values.discovery.backend "consul") .root.Values.discovery.consul.tokenSecret }}
- name: consul-token
  secret:
    secretName: {{ .root.Values.discovery.consul.tokenSecret }}
    defaultMode: 0440
{{- end }}
{{- end -}}

{{/* "true" when the frontends keep their audit chain (and enrolled certificate) on a claim of their own: they
     are a StatefulSet then. */}}
{{- define "zl.frontendPersistent" -}}
{{- if and .Values.frontend.audit.enabled .Values.frontend.audit.persistence.enabled }}true{{ end }}
{{- end -}}

{{/* The identity mounts of a tier (dict "root" $ "tier" "worker"), beside zl.mounts. */}}
{{- define "zl.identityMounts" -}}
{{- if ne .tier "worker" }}
- {name: key-pepper, mountPath: /etc/zerolayer/key-pepper, readOnly: true}
{{- end }}
{{- if and (eq .tier "frontend") (include "zl.frontendPersistent" .root) }}
# On the pod's own claim, beside its audit chain: a StatefulSet pod keeps its name, so it keeps its certificate.
- {name: audit, mountPath: /var/lib/zerolayer/identity, subPath: identity}
{{- else if ne .tier "orchestrator" }}
- {name: identity, mountPath: /var/lib/zerolayer/identity}
{{- else if not .root.Values.tls.certManager.enabled }}
- {name: enroll-ca, mountPath: /etc/zerolayer/enroll, readOnly: true}
{{- end }}
{{- end -}}

{{/* Identity settings of a config file (TOML): where a worker or frontend keeps its enrolled certificate and whom
     it enrolls with; the key an orchestrator signs with. */}}
{{- define "zl.identityConfig" -}}
{{- if ne .tier "worker" }}
key-pepper-file = "/etc/zerolayer/key-pepper/pepper"
{{- end }}
{{- if ne .tier "orchestrator" }}
identity-dir = "/var/lib/zerolayer/identity"
{{- if eq .root.Values.discovery.backend "consul" }}
enroll-at = {{ include "zl.orchestratorAddrs" .root }}
{{- end }}
{{- else if not .root.Values.tls.certManager.enabled }}
enroll-ca-key = "/etc/zerolayer/enroll/ca.key"
{{- end }}
{{- end -}}

{{- define "zl.mounts" -}}
- name: tls
  mountPath: /etc/zerolayer/tls
  readOnly: true
- name: config
  mountPath: /etc/zerolayer/config
  readOnly: true
- name: tmp
  mountPath: /tmp
{{- if and (eq .Values.discovery.backend "consul") .Values.discovery.consul.tokenSecret }}
- name: consul-token
  mountPath: /etc/zerolayer/consul
  readOnly: true
{{- end }}
{{- end -}}

{{/* The admin certificate volume of the admin Jobs (bootstrap, keys): `zl admin --node-id zl-bootstrap`. */}}
{{- define "zl.adminTlsVolume" -}}
{{- $full := include "zl.fullname" . -}}
- name: tls
{{- if .Values.tls.certManager.enabled }}
  projected:
    defaultMode: 0440
    sources:
      - secret:
          name: {{ $full }}-tls-admin
          items:
            - {key: tls.crt, path: admin-zl-bootstrap.pem}
            - {key: tls.key, path: admin-zl-bootstrap.key}
            - {key: ca.crt, path: ca.pem}
{{- else }}
  secret:
    secretName: {{ $full }}-tls-admin
    defaultMode: 0440
{{- end }}
{{- end -}}

{{/* The frontend's peer regions as ZL_PEER_REGIONS wants them: REGION=URL,... nearest first. */}}
{{- define "zl.peerRegions" -}}
{{- range $i, $p := .Values.frontend.peerRegions }}{{ if $i }},{{ end }}{{ $p.region }}={{ $p.url }}{{ end }}
{{- end -}}

{{/* A pod's config checksum: its tier's values with every shared value its config, environment or mounts take
(the image, TLS, region, discovery, tracing) and the orchestrator count (the Raft peers and every tier's static
list of orchestrators), so that a change to any of them rolls the pods that hold the old one. */}}
{{- define "zl.configChecksum" -}}
{{- $v := .root.Values -}}
{{- $shared := pick $v "image" "clusterDomain" "tls" "otlp" "region" "discovery" "nameOverride" "fullnameOverride" -}}
{{- list $shared .tier $v.orchestrator.replicas | toJson | sha256sum | trunc 16 -}}
{{- end -}}

{{/* `zl admin` as the chart's admin Jobs run it: against the orchestrators' Service, with the admin certificate. */}}
{{- define "zl.adminCommand" -}}
/usr/local/bin/zl, admin, --orchestrator, "{{ include "zl.orchestrator" . }}:7001", --tls-dir, /tls, --node-id, zl-bootstrap
{{- end -}}

{{/* A tier's (or pool's) pass-through pod settings, at the pod spec's indentation: priority and runtime classes. */}}
{{- define "zl.podClasses" -}}
{{- with .priorityClassName }}
priorityClassName: {{ . }}
{{- end }}
{{- with .runtimeClassName }}
runtimeClassName: {{ . }}
{{- end }}
{{- end -}}

{{/* An image: the chart's, with a pool's repository and tag over it where it names them. */}}
{{- define "zl.imageFor" -}}
{{- $image := .root.Values.image -}}
{{- $over := .image | default dict -}}
{{- printf "%s:%s" ($over.repository | default $image.repository) ($over.tag | default $image.tag | default .root.Chart.AppVersion) -}}
{{- end -}}

{{/* The ServiceAccount a tier's pods run as (dict "root" $ "tier" "worker"): one per tier, so that what Kubernetes
     grants an identity (cert-manager's approver-policy, a cloud's workload identity) is granted to one tier. */}}
{{- define "zl.serviceAccount" -}}
{{- printf "%s-%s" (include "zl.fullname" .root) .tier -}}
{{- end -}}
