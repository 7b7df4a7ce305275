//! Where a server listens, as the connections to it and the cancels sent to it reach it.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;

/// Where a server listens: TCP, or a Unix socket when the configured host is a directory.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ServerAddr {
    Tcp(SocketAddr),
    /// The socket file, `<dir>/.s.PGSQL.<port>`.
    Unix(Arc<Path>),
}
