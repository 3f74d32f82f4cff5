#!/bin/sh
# The front end's container entrypoint: HAProxy with the shipped config, its replicas
# found through DNS. HAProxy's resolver asks for names exactly as written (no search
# domains), so the Service name is completed with the first search domain of
# /etc/resolv.conf: `<namespace>.svc.<cluster domain>` under Kubernetes,
# `dns.podman` under `podman kube play`. TINYHAL_REPLICAS_DNS, when set, wins.
set -eu
if [ -z "${TINYHAL_REPLICAS_DNS:-}" ]; then
  service="${TINYHAL_REPLICAS_SERVICE:-tinyhal-serve}"
  domain="$(sed -n 's/^search[[:space:]]\{1,\}\([^[:space:]]*\).*/\1/p' /etc/resolv.conf | head -n 1)"
  TINYHAL_REPLICAS_DNS="${service}${domain:+.$domain}:${TINYHAL_REPLICAS_PORT:-8000}"
  export TINYHAL_REPLICAS_DNS
fi
echo "tinyhal front end: replicas from DNS name ${TINYHAL_REPLICAS_DNS}" >&2
exec haproxy -W -db -f "${TINYHAL_LB_CONFIG:-/etc/tinyhal-lb/haproxy.cfg}" "$@"
