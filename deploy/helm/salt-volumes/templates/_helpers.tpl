{{/*
salt-volumes.config is serve's config.yaml: the keys the chart sets from
its values, with .Values.config merged over them (a key given there wins).
The ConfigMap holds it; its checksum on the pods rolls them when it changes.
*/}}
{{- define "salt-volumes.config" -}}
{{- $config := dict "tokenFile" "/etc/salt-volumes/secret/token" "events" (dict "source" "sse") "kubernetes" (dict "volumeObjects" true) -}}
{{- $url := required "salt.url is required: the salt-api serve talks to, e.g. --set salt.url=https://salt-master.example.com:8000" .Values.salt.url -}}
{{- $_ := set $config "salt" (dict "url" $url "username" .Values.salt.username "passwordFile" "/etc/salt-volumes/secret/salt-password" "eauth" .Values.salt.eauth) -}}
{{- if .Values.tls.secretName -}}
{{- $_ := set $config "tls" (dict "certFile" "/etc/salt-volumes/tls/tls.crt" "keyFile" "/etc/salt-volumes/tls/tls.key") -}}
{{- else -}}
{{- $_ := set $config "insecure" true -}}
{{- end -}}
{{- toYaml (mustMergeOverwrite $config (deepCopy .Values.config)) -}}
{{- end -}}
