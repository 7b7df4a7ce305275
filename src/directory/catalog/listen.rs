//! This proxy's one LISTEN connection to the catalog (pooled connections would drop
//! notifications), shared by everything that listens: the routing watcher and the
//! moves' agent each subscribe to their channel on it and send their own queries
//! through its client (tokio-postgres pipelines them on the one connection). A
//! channel's notifications come through a bounded queue; when the connection ends,
//! every queue closes, and the next subscription connects again, once for all.
//! Catalog connections per proxy stay few whatever the fleet (issue 56).

use std::collections::HashMap;
use std::future::poll_fn;
use std::sync::{Arc, Mutex};

use tokio::sync::mpsc;
use tokio_postgres::{AsyncMessage, Client, Notification};

/// The catalog connection the listeners share.
pub struct CatalogLink {
    pg: tokio_postgres::Config,
    current: tokio::sync::Mutex<Option<Arc<Connected>>>,
}

struct Connected {
    client: Arc<Client>,
    /// Each channel's queue.
    routes: Arc<Mutex<HashMap<String, mpsc::Sender<Notification>>>>,
    _reader: AbortOnDrop,
}

/// A subscription to one channel, and the shared connection's client.
pub struct CatalogListener {
    pub client: Arc<Client>,
    /// Closed when the connection ends.
    pub notifications: mpsc::Receiver<Notification>,
    _connected: Arc<Connected>,
}

fn routes_of(
    m: &Mutex<HashMap<String, mpsc::Sender<Notification>>>,
) -> std::sync::MutexGuard<'_, HashMap<String, mpsc::Sender<Notification>>> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl CatalogLink {
    pub fn new(pg: tokio_postgres::Config) -> Arc<Self> {
        Arc::new(Self { pg, current: tokio::sync::Mutex::new(None) })
    }

    /// LISTENs on `channel` over the shared connection (connecting first when there
    /// is none); at most `backlog` of its notifications wait unread (then the
    /// connection is not read until they are: the catalog cannot make this proxy hold
    /// more). A channel subscribed again replaces its earlier queue.
    pub async fn listen(
        &self,
        channel: &str,
        backlog: usize,
    ) -> Result<CatalogListener, tokio_postgres::Error> {
        let mut current = self.current.lock().await;
        let connected = match current.as_ref().filter(|c| !c.client.is_closed()) {
            Some(connected) => connected.clone(),
            None => {
                let connected = Arc::new(connect(&self.pg).await?);
                *current = Some(connected.clone());
                connected
            }
        };
        drop(current);
        let (tx, notifications) = mpsc::channel(backlog);
        routes_of(&connected.routes).insert(channel.to_string(), tx);
        connected.client.batch_execute(&format!("LISTEN {channel}")).await?;
        Ok(CatalogListener { client: connected.client.clone(), notifications, _connected: connected })
    }
}

async fn connect(pg: &tokio_postgres::Config) -> Result<Connected, tokio_postgres::Error> {
    let (client, mut connection) = pg.connect(tokio_postgres::NoTls).await?;
    let routes: Arc<Mutex<HashMap<String, mpsc::Sender<Notification>>>> = Arc::default();
    let to = routes.clone();
    let reader = tokio::spawn(async move {
        while let Some(message) = poll_fn(|cx| connection.poll_message(cx)).await {
            match message {
                Ok(AsyncMessage::Notification(n)) => {
                    let route = routes_of(&to).get(n.channel()).cloned();
                    // A listener gone (its queue closed) is skipped; the others go on.
                    if let Some(route) = route {
                        let _ = route.send(n).await;
                    }
                }
                Ok(_) => {}
                Err(e) => {
                    tracing::debug!(error = %e, "catalog connection ended");
                    break;
                }
            }
        }
        // Every listener sees its queue close, and subscribes again.
        routes_of(&to).clear();
    });
    Ok(Connected { client: Arc::new(client), routes, _reader: AbortOnDrop(reader) })
}

struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}
