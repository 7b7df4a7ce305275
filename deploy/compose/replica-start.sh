#!/usr/bin/env bash
# A replica's start: copies its primary once (pg_basebackup -R), then runs as a standby.
set -euo pipefail
if [ ! -s "$PGDATA/PG_VERSION" ]; then
  until pg_isready -h "$PRIMARY_HOST" -U replicator -d postgres; do sleep 1; done
  PGPASSWORD="$REPLICATION_PASSWORD" pg_basebackup -h "$PRIMARY_HOST" -U replicator -D "$PGDATA" -R -X stream
  chmod 0700 "$PGDATA"
fi
exec postgres
