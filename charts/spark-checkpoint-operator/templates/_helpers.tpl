{{/* Names and labels shared by every template. */}}

{{- define "sco.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "sco.fullname" -}}
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

{{/* The name of a cluster-scoped object, or of one in a namespace the release serves
besides its own: qualified by the release's namespace, so that releases of one name in two
namespaces (one per team, say) never claim the same object. */}}
{{- define "sco.clusterScopedName" -}}
{{- printf "%s-%s" (include "sco.fullname" .) .Release.Namespace }}
{{- end }}

{{/* The name of an object in namespace .namespace (of the release .root). */}}
{{- define "sco.nameIn" -}}
{{- if eq .namespace .root.Release.Namespace }}
{{- include "sco.fullname" .root }}
{{- else }}
{{- include "sco.clusterScopedName" .root }}
{{- end }}
{{- end }}

{{- define "sco.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The operator pods' identity: the Deployment's selector and the NetworkPolicy's source. */}}
{{- define "sco.selectorLabels" -}}
app.kubernetes.io/name: {{ include "sco.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end }}

{{- define "sco.labels" -}}
helm.sh/chart: {{ include "sco.chart" . }}
{{ include "sco.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: spark-checkpoint-operator
{{- end }}

{{- define "sco.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "sco.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "sco.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- with .Values.image.digest }}@{{ . }}{{ end }}
{{- end }}

{{/* A Service's name is a DNS label (63 characters): the suffix always fits. */}}
{{- define "sco.metricsServiceName" -}}
{{- printf "%s-metrics" (include "sco.fullname" . | trunc 55 | trimSuffix "-") }}
{{- end }}

{{/* The operator pods' labels: podLabels cannot change the selector's (the Deployment's
selector is immutable and would no longer select its own pods). */}}
{{- define "sco.podLabels" -}}
{{- $selector := include "sco.selectorLabels" . | fromYaml }}
{{- range $key, $_ := .Values.podLabels }}
{{- if hasKey $selector $key }}
{{- fail (printf "podLabels: %s is a selector label of the operator's Deployment and cannot be set" $key) }}
{{- end }}
{{- end }}
{{- include "sco.selectorLabels" . }}
{{- with .Values.podLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* The namespaces the operator serves, as a JSON list: empty when it serves all of them
(clusterWide), else watchNamespaces, else the release's own namespace. */}}
{{- define "sco.watchedNamespaces" -}}
{{- if .Values.clusterWide }}
{{- if .Values.watchNamespaces }}
{{- fail "clusterWide serves every namespace: leave watchNamespaces empty, or set clusterWide=false to serve only the listed ones" }}
{{- end }}
{{- toJson list }}
{{- else }}
{{- toJson (.Values.watchNamespaces | default (list .Release.Namespace)) }}
{{- end }}
{{- end }}

{{/* The namespaces that get a NetworkPolicy for their drivers (see values.yaml). */}}
{{- define "sco.networkPolicyNamespaces" -}}
{{- if .Values.clusterWide }}
{{- toJson .Values.networkPolicy.namespaces }}
{{- else }}
{{- include "sco.watchedNamespaces" . }}
{{- end }}
{{- end }}

{{/*
What the operator itself does in each namespace it serves (docs/operator.md, "What the
operator creates"); tests/chart/test_chart.py checks these against a recorded run.
*/}}
{{- define "sco.operatorRules" -}}
# Kopf lists and watches jobs and patches them (finalizer, progress annotations); the
# controller reads a job's stored status when its daemon starts, and patches its rollback
# annotations (spec.rollback: the last stable spec, the rollback's state).
- apiGroups: [sparkcheckpoint.io]
  resources: [sparkcheckpointjobs]
  verbs: [get, list, watch, patch]
# The controller writes the job's status (merge patch on the status subresource).
- apiGroups: [sparkcheckpoint.io]
  resources: [sparkcheckpointjobs/status]
  verbs: [patch]
# Snapshots: Kopf lists and watches them; the controller of the job each names writes its
# status (merge patch on the status subresource) and its savepoint-disposal finalizer
# (merge patch of metadata.finalizers), and creates and deletes the mirrors of the job's
# savepoints (spec.savepoints.snapshotObjects).
- apiGroups: [sparkcheckpoint.io]
  resources: [sparkcheckpointsnapshots]
  verbs: [list, watch, patch, create, delete]
- apiGroups: [sparkcheckpoint.io]
  resources: [sparkcheckpointsnapshots/status]
  verbs: [patch]
# Driver and cleanup pods: Kopf watches them; the runtime creates, reads and deletes them.
- apiGroups: [""]
  resources: [pods]
  verbs: [get, list, watch, create, delete]
# The agent's token Secret: created per job, patched per attempt, read back on adoption.
- apiGroups: [""]
  resources: [secrets]
  verbs: [get, create, patch]
# The job's events (DriverStarting, SavepointCompleted, ...), posted through Kopf.
- apiGroups: [""]
  resources: [events]
  verbs: [create]
# A Lease per job (<job>.sparkcheckpoint.io): the one operator that drives it holds it.
- apiGroups: [coordination.k8s.io]
  resources: [leases]
  verbs: [get, create, update]
{{- end }}

{{/* The operator container's environment: the chart's own (HOME in /tmp: the root
filesystem is read-only; the pod's name: who holds a job's Lease, the same across its
container's restarts; its namespace and service account, which the operator refuses for a
job's pods; who chooses the jobs' pods' user ids), then operator.env, which may not set a variable twice (server-side apply
refuses a duplicate name, client-side apply keeps the last and drops it at the next change)
nor move the metrics port (the Service and ServiceMonitor expect 9090). */}}
{{- define "sco.operatorEnv" -}}
{{- $chart := list
  (dict "name" "HOME" "value" "/tmp")
  (dict "name" "PYTHONDONTWRITEBYTECODE" "value" "1")
  (dict "name" "PYTHONUNBUFFERED" "value" "1")
  (dict "name" "SPARK_CHECKPOINT_OPERATOR_POD" "valueFrom" (dict "fieldRef" (dict "fieldPath" "metadata.name")))
  (dict "name" "SPARK_CHECKPOINT_OPERATOR_NAMESPACE" "valueFrom" (dict "fieldRef" (dict "fieldPath" "metadata.namespace")))
  (dict "name" "SPARK_CHECKPOINT_OPERATOR_SERVICE_ACCOUNT" "valueFrom" (dict "fieldRef" (dict "fieldPath" "spec.serviceAccountName")))
  (dict "name" "SPARK_CHECKPOINT_USER_IDS" "value" .Values.userIds)
  (dict "name" "SPARK_CHECKPOINT_METRICS_ADDRESS" "value" .Values.operator.listenAddress)
}}
{{- $reserved := list "SPARK_CHECKPOINT_METRICS_PORT" }}
{{- range $chart }}
{{- $reserved = append $reserved .name }}
{{- end }}
{{- range .Values.operator.env }}
{{- if has .name $reserved }}
{{- fail (printf "operator.env: %s is set by the chart and cannot be set here" .name) }}
{{- end }}
{{- end }}
{{- toYaml (concat $chart (.Values.operator.env | default list)) }}
{{- end }}

{{/* A Prometheus duration ("1m30s") in milliseconds: a year is 365 days, as Prometheus counts. */}}
{{- define "sco.milliseconds" -}}
{{- $unit := dict "y" 31536000000 "w" 604800000 "d" 86400000 "h" 3600000 "m" 60000 "s" 1000 "ms" 1 }}
{{- $total := 0 }}
{{- range regexFindAll "[0-9]+(ms|[ywdhms])" . -1 }}
{{- $number := regexFind "^[0-9]+" . }}
{{- $total = add $total (mul (atoi $number) (get $unit (trimPrefix $number .))) }}
{{- end }}
{{- $total }}
{{- end }}
