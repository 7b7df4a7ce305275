#!/usr/bin/env bash
# A shard primary's first start (docker-entrypoint-initdb.d): the application role and
# database, a replication role for its replica, and the demo table.
set -euo pipefail
psql -v ON_ERROR_STOP=1 --username "$POSTGRES_USER" <<SQL
CREATE ROLE app LOGIN PASSWORD '${APP_PASSWORD}';
CREATE ROLE replicator REPLICATION LOGIN PASSWORD '${REPLICATION_PASSWORD}';
CREATE DATABASE app OWNER app;
SQL
psql -v ON_ERROR_STOP=1 --username "$POSTGRES_USER" --dbname app <<SQL
CREATE TABLE accounts (id bigserial PRIMARY KEY, tenant_id bigint NOT NULL, name text NOT NULL);
CREATE INDEX ON accounts (tenant_id);
ALTER TABLE accounts OWNER TO app;
SQL
echo "host replication replicator all scram-sha-256" >>"$PGDATA/pg_hba.conf"
