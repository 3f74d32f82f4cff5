#!/bin/sh
# The front end's container entrypoint: HAProxy with the shipped config, its replicas
# found through DNS. HAProxy's resolver asks for names exactly as written (no search
# domains), so the Service name is completed with the first search domain of
# /etc/resolv.conf: `<namespace>.svc.<cluster domain>` under Kubernetes.
#
# `podman kube play` has no Service DNS: a Deployment's pods answer only to their own
# names, `<deployment>-pod-<i>` (search domain `dns.podman`). There the config is copied
# to /tmp with one server per such name appended to its last section, the `replicas`
# backend (HAProxy resolves them, and follows pods that come and go).
set -eu
config="${TINYHAL_LB_CONFIG:-/etc/tinyhal-lb/haproxy.cfg}"
service="${TINYHAL_REPLICAS_SERVICE:-tinyhal-serve}"
port="${TINYHAL_REPLICAS_PORT:-8000}"
domain="$(sed -n 's/^search[[:space:]]\{1,\}\([^[:space:]]*\).*/\1/p' /etc/resolv.conf | head -n 1)"
if [ -z "${TINYHAL_REPLICAS_DNS:-}" ]; then
  TINYHAL_REPLICAS_DNS="${service}${domain:+.$domain}:${port}"
  export TINYHAL_REPLICAS_DNS
fi
if [ "$domain" = "dns.podman" ]; then
  cp "$config" /tmp/haproxy.cfg
  i=0
  while [ "$i" -lt "${TINYHAL_MAX_REPLICAS:-16}" ]; do
    pod="${service}-pod-$i"
    echo "    server $pod $pod.$domain:$port resolvers cluster init-addr none" >> /tmp/haproxy.cfg
    i=$((i + 1))
  done
  config=/tmp/haproxy.cfg
fi
echo "tinyhal front end: replicas from DNS (${TINYHAL_REPLICAS_DNS}${domain:+, search domain $domain})" >&2
exec haproxy -W -db -f "$config" "$@"
