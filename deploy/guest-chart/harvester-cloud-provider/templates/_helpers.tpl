{{/* The cloud provider's name: nameOverride, else the chart's name. */}}
{{- define "hcp.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* The name of the cloud provider's objects: fullnameOverride, else hcp.name. */}}
{{- define "hcp.fullname" -}}
{{- default (include "hcp.name" .) .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "hcp.serviceAccountName" -}}
{{- default (include "hcp.fullname" .) .Values.serviceAccount.name -}}
{{- end -}}

{{- define "hcp.chartLabel" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Labels of every object; `component` names the part (e.g. ccm). */}}
{{- define "hcp.commonLabels" -}}
helm.sh/chart: {{ include "hcp.chartLabel" . }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: harvester-cloud
{{- end -}}

{{- define "hcp.selectorLabels" -}}
app.kubernetes.io/name: {{ include "hcp.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "hcp.ccm.selectorLabels" -}}
app.kubernetes.io/name: harvester-cloud-ccm
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{/* "<registry>/" for every image: Rancher's global.cattle.systemDefaultRegistry, else RKE2's
     global.systemDefaultRegistry, else nothing. */}}
{{- define "hcp.registryPrefix" -}}
{{- $global := .Values.global | default dict -}}
{{- $cattle := $global.cattle | default dict -}}
{{- $registry := $cattle.systemDefaultRegistry | default $global.systemDefaultRegistry | default "" -}}
{{- if $registry -}}{{ printf "%s/" (trimSuffix "/" $registry) }}{{- end -}}
{{- end -}}

{{- define "hcp.ccm.image" -}}
{{- $image := .Values.harvesterCloud.image -}}
{{- $registry := include "hcp.registryPrefix" . | default (printf "%s/" $image.registry) -}}
{{- printf "%s%s:%s" $registry $image.repository (default .Chart.AppVersion $image.tag) -}}
{{- end -}}

{{/* The value of `--<flag>=` in extraArgs, the last one if several (as the flag library reads
     them), or "". */}}
{{- define "hcp.extraArg" -}}
{{- $prefix := printf "--%s=" .flag -}}
{{- $found := "" -}}
{{- range .args -}}
{{- if hasPrefix $prefix (toString .) -}}{{- $found = trimPrefix $prefix (toString .) -}}{{- end -}}
{{- end -}}
{{- $found -}}
{{- end -}}

{{/* The cluster name both controllers get: global.cattle.clusterName, else the cloud provider's
     --cluster-name in extraArgs. */}}
{{- define "hcp.clusterName" -}}
{{- $cattle := (.Values.global | default dict).cattle | default dict -}}
{{- $cattle.clusterName | default (include "hcp.extraArg" (dict "flag" "cluster-name" "args" .Values.extraArgs)) -}}
{{- end -}}

{{/* The cloud-config volume (the same for both Deployments), or a failure naming the values. */}}
{{- define "hcp.cloudConfigVolume" -}}
- name: cloud-config
{{- if .Values.cloudConfig.secretName }}
  secret:
    secretName: {{ .Values.cloudConfig.secretName }}
    items:
      - key: {{ .Values.cloudConfig.secretKey | default "cloud-config" }}
        path: cloud-config
{{- else if .Values.cloudConfigPath }}
  hostPath:
    path: {{ .Values.cloudConfigPath }}
    type: File
{{- else if .Values.cloudConfig.hostPath }}
  hostPath:
    path: {{ .Values.cloudConfig.hostPath }}
    type: File
{{- else }}
{{- fail "harvester-cloud-provider: no cloud-config: set cloudConfig.secretName (a Secret with the kubeconfig), cloudConfigPath or cloudConfig.hostPath (a file on every node)" }}
{{- end }}
{{- end -}}

{{- define "hcp.cloudConfigMount" -}}
- name: cloud-config
  mountPath: /etc/kubernetes/cloud-config
  readOnly: true
  {{- if .Values.cloudConfig.secretName }}
  subPath: cloud-config
  {{- end }}
{{- end -}}

{{/* kube-vip's names and labels. */}}
{{- define "kv.name" -}}
{{- $kv := index .Values "kube-vip" -}}
{{- default (default "kube-vip" $kv.nameOverride) $kv.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "kv.namespace" -}}
{{- (index .Values "kube-vip").namespaceOverride | default .Release.Namespace -}}
{{- end -}}

{{- define "kv.serviceAccountName" -}}
{{- $sa := (index .Values "kube-vip").serviceAccount -}}
{{- if $sa.create -}}
{{- default (include "kv.name" .) $sa.name -}}
{{- else -}}
{{- default "default" $sa.name -}}
{{- end -}}
{{- end -}}

{{- define "kv.selectorLabels" -}}
app.kubernetes.io/name: {{ default "kube-vip" (index .Values "kube-vip").nameOverride }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}
