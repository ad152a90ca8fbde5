#!/bin/sh
# Runs one class from the broker's jars, as the distribution's script of this name does.
# A tool's JVM starts quicker with the client compiler and the serial collector.
set -e
home=$(cd "$(dirname "$0")/.." && pwd)
exec java ${KAFKA_HEAP_OPTS:-} \
  ${KAFKA_JVM_PERFORMANCE_OPTS:--XX:TieredStopAtLevel=1 -XX:+UseSerialGC} ${KAFKA_OPTS:-} \
  "-Dlog4j2.configurationFile=${KAFKA_LOG4J_CONFIG:-$home/config/tools-log4j2.properties}" \
  -Djava.awt.headless=true -cp "$home/libs/*" "$@"
