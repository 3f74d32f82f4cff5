#!/bin/sh
# tinyhal-serve replicas behind HAProxy on 127.0.0.1 (see local.py and deploy/README.md):
#   deploy/haproxy/local.sh --replicas N --port P [tinyhal-serve flags...]
exec "${PYTHON:-python3}" "$(dirname "$0")/local.py" "$@"
