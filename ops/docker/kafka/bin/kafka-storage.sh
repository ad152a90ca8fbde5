#!/bin/sh
# kafka-storage.sh: the tool of that name, from the broker's jars.
exec "$(dirname "$0")/kafka-run-class.sh" kafka.tools.StorageTool "$@"
