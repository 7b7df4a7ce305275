//! Integration tests: real PostgreSQL clusters, the real proxy, real clients.

mod harness;

mod clients;
mod drivers;
mod failures;
mod routing;
mod startup;
