//! A TCP relay in front of a real server that holds every CancelRequest back for a
//! while before passing it on: a slow path to the postmaster (a busy one, or one
//! across a slow network), which is when a cancel lands after its statement ended.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// The 8-byte header of a CancelRequest: length 16, code 80877102.
const CANCEL_HEADER: [u8; 8] = [0, 0, 0, 16, 0x04, 0xd2, 0x16, 0x2e];

/// Relays connections to `server`; a connection that starts with a CancelRequest is
/// passed on `hold` later. Runs until the test's runtime ends. Also returns how many
/// cancel requests it has received so far.
pub async fn relay_holding_cancels(server: SocketAddr, hold: Duration) -> (SocketAddr, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let received = Arc::new(AtomicUsize::new(0));
    let counter = received.clone();
    tokio::spawn(async move {
        while let Ok((mut client, _)) = listener.accept().await {
            let counter = counter.clone();
            tokio::spawn(async move {
                let mut head = [0u8; 8];
                if client.read_exact(&mut head).await.is_err() {
                    return;
                }
                if head == CANCEL_HEADER {
                    counter.fetch_add(1, Ordering::SeqCst);
                    tokio::time::sleep(hold).await;
                }
                let Ok(mut server) = TcpStream::connect(server).await else { return };
                if server.write_all(&head).await.is_ok() {
                    let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
                }
            });
        }
    });
    (addr, received)
}
