#!/bin/sh
# Healthy once Prometheus answers /-/ready on its listen address.
exec wget -q -O /dev/null -T 4 "http://${LISTEN_ADDRESS:-127.0.0.1:9090}/-/ready"
