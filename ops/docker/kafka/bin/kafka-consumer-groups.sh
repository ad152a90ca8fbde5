#!/bin/sh
# kafka-consumer-groups.sh: the tool of that name, from the broker's jars.
exec "$(dirname "$0")/kafka-run-class.sh" org.apache.kafka.tools.consumer.group.ConsumerGroupCommand "$@"
