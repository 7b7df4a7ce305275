//! Integration tests: real PostgreSQL clusters, the real proxy, real clients.

mod harness;

mod admin;
mod adversarial;
mod catalog;
mod classifier;
mod cli;
mod clients;
mod copy_errors;
mod database_logins;
mod docs;
mod drivers;
mod failover;
mod failures;
mod fair_share;
mod lifecycle;
mod logins;
mod memory_limits;
mod moves;
mod operators;
mod own_names;
mod pipelining;
mod placement;
mod pooling;
mod read_only;
mod replica_reads;
mod routing;
mod scatter;
mod set_family;
mod slow_statements;
mod snowflake;
mod sql_routing;
mod startup;
mod strict;
mod tenant_isolation;
mod tenant_stats;
