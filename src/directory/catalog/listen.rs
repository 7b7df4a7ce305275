//! A catalog connection of its own that LISTENs on a channel (pooled connections
//! would drop notifications): its notifications come through a bounded channel, and
//! the task that reads them off the connection stops when the listener is dropped.

use std::future::poll_fn;

use tokio::sync::mpsc;
use tokio_postgres::{AsyncMessage, Client, Notification};

/// A connection subscribed to one channel.
pub struct CatalogListener {
    pub client: Client,
    /// Closed when the connection ends.
    pub notifications: mpsc::Receiver<Notification>,
    _reader: AbortOnDrop,
}

/// Connects and LISTENs on `channel`; at most `backlog` notifications wait unread
/// (then the connection is not read until they are: the catalog cannot make this
/// proxy hold more).
pub async fn listen_to_catalog(
    pg: &tokio_postgres::Config,
    channel: &str,
    backlog: usize,
) -> Result<CatalogListener, tokio_postgres::Error> {
    let (client, mut connection) = pg.connect(tokio_postgres::NoTls).await?;
    let (tx, notifications) = mpsc::channel(backlog);
    let reader = tokio::spawn(async move {
        while let Some(message) = poll_fn(|cx| connection.poll_message(cx)).await {
            match message {
                Ok(AsyncMessage::Notification(n)) => {
                    if tx.send(n).await.is_err() {
                        return;
                    }
                }
                Ok(_) => {}
                Err(e) => {
                    tracing::debug!(error = %e, "catalog connection ended");
                    return;
                }
            }
        }
    });
    let listener = CatalogListener { client, notifications, _reader: AbortOnDrop(reader) };
    listener.client.batch_execute(&format!("LISTEN {channel}")).await?;
    Ok(listener)
}

struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}
