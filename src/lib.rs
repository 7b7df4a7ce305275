//! pgtenant: a tenant-aware PostgreSQL connection proxy.
//!
//! # Layout
//!
//! Layers, each a folder, dependencies pointing down:
//!
//! - `cli`, `dev`: the command line and the local development setup.
//! - `server`: wires the layers together and owns shutdown.
//! - `frontend`: listener, TLS, startup, client auth, the per-client `Session` loop.
//! - `admin`: the admin console, scatter-gather, `/metrics` and readiness.
//! - `tenancy`: pauses, placement of new tenants, online tenant moves.
//! - `router`: the tenant of a request and the route it takes.
//! - `directory`: tenant -> shard resolution.
//! - `snowflake`: IDs minted by the proxy, and the instance number's lease.
//! - `backend`: server connections, pools, what each server still owes.
//! - `net`: socket streams and buffered duplex I/O shared by frontend and backend.
//! - `protocol`: I/O-free framing and the few message views and builders needed.
//! - `config`: configuration types and validation.
//! - `observe`: counters, connection registries, the HTTP port, logging.
//! - `fuzzing`: the fuzz targets' entry points (`fuzz/`), and their replay in the
//!   tests; compiled for tests and with the `fuzzing` feature (the fuzz crate's) only.

pub mod admin;
pub mod backend;
pub mod cli;
pub mod config;
pub mod dev;
pub mod directory;
pub mod frontend;
#[cfg(any(test, feature = "fuzzing"))]
#[doc(hidden)]
pub mod fuzzing;
pub mod net;
pub mod observe;
pub mod protocol;
pub mod router;
pub mod server;
pub mod snowflake;
pub mod tenancy;
