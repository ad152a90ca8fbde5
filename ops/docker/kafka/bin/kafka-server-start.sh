#!/bin/sh
# kafka-server-start.sh CONFIG: the broker in the foreground, logging to stdout.
home=$(cd "$(dirname "$0")/.." && pwd)
export KAFKA_HEAP_OPTS="${KAFKA_HEAP_OPTS:--Xmx1G -Xms1G}"
export KAFKA_JVM_PERFORMANCE_OPTS="${KAFKA_JVM_PERFORMANCE_OPTS:--XX:+UseG1GC -XX:MaxGCPauseMillis=20}"
export KAFKA_LOG4J_CONFIG="${KAFKA_LOG4J_CONFIG:-$home/config/log4j2.properties}"
exec "$home/bin/kafka-run-class.sh" kafka.Kafka "$@"
