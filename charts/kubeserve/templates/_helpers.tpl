{{/* Chart name, overridable. */}}
{{- define "kubeserve.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Release-scoped name: the release name when it already contains the chart name. */}}
{{- define "kubeserve.fullname" -}}
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

{{- define "kubeserve.operatorName" -}}
{{- printf "%s-operator" (include "kubeserve.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "kubeserve.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "kubeserve.operatorName" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "kubeserve.selectorLabels" -}}
app.kubernetes.io/name: {{ include "kubeserve.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end -}}

{{- define "kubeserve.labels" -}}
{{ include "kubeserve.selectorLabels" . }}
app.kubernetes.io/part-of: kubeserve
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{- define "kubeserve.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{/*
Namespaces the operator watches, comma-separated; empty for the whole cluster. A list always includes
the release namespace: the admin API writes custom resources into the operator's own namespace.
*/}}
{{- define "kubeserve.watchNamespaces" -}}
{{- if .Values.watchNamespaces -}}
{{- append .Values.watchNamespaces .Release.Namespace | uniq | join "," -}}
{{- end -}}
{{- end -}}

{{/*
Rules on cluster-scoped objects: kopf scans custom resource definitions; the admin API reviews its
callers' tokens and rights (TokenReview, SubjectAccessReview). Never namespaces: with a list of
namespaces (exact names) kopf neither lists nor watches them (its scanning is off then).
*/}}
{{- define "kubeserve.clusterRules" -}}
- apiGroups: [apiextensions.k8s.io]
  resources: [customresourcedefinitions]
  verbs: [get, list, watch]
- apiGroups: [authentication.k8s.io]
  resources: [tokenreviews]
  verbs: [create]
- apiGroups: [authorization.k8s.io]
  resources: [subjectaccessreviews]
  verbs: [create]
{{- end -}}

{{/*
Rules in each watched namespace (in a ClusterRole when the whole cluster is watched). The data-plane
Role the operator creates grants only reads the operator holds itself, so no escalate or bind verb.
*/}}
{{- define "kubeserve.namespacedRules" -}}
- apiGroups: [kubeserve.io]
  resources: [serveinstances, serveapplications]
  verbs: [get, list, watch, create, update, patch, delete]
- apiGroups: [kubeserve.io]
  resources: [serveinstances/status, serveapplications/status]
  verbs: [get, update, patch]
- apiGroups: [kubeserve.io]
  resources: [serveinstances/finalizers, serveapplications/finalizers]
  verbs: [update]
- apiGroups: [apps]
  resources: [deployments, daemonsets]
  verbs: [get, list, watch, create, update, patch, delete]
- apiGroups: [""]
  resources: [services, configmaps]
  verbs: [get, list, watch, create, update, patch, delete]
- apiGroups: [batch]
  resources: [jobs]
  verbs: [get, list, watch, create, patch, delete]
- apiGroups: [networking.k8s.io]
  resources: [networkpolicies]
  verbs: [get, list, watch, create, patch, delete]
- apiGroups: [policy]
  resources: [poddisruptionbudgets]
  verbs: [get, list, watch, create, patch, delete]
- apiGroups: [""]
  resources: [secrets]
  verbs: [get, create]
- apiGroups: [""]
  resources: [pods]
  verbs: [get, list, watch, create]
- apiGroups: [""]
  resources: [serviceaccounts]
  verbs: [get, list, watch, create, patch]
- apiGroups: [rbac.authorization.k8s.io]
  resources: [roles, rolebindings]
  verbs: [get, list, watch, create, patch]
- apiGroups: [discovery.k8s.io]
  resources: [endpointslices]
  verbs: [get, list, watch]
- apiGroups: [""]
  resources: [events]
  verbs: [create, patch]
- apiGroups: [events.k8s.io]
  resources: [events]
  verbs: [create, patch]
{{- end -}}
