//! A network link between two places that the test controls: a TCP forwarder to a port that adds a delay to every
//! byte each way, or is cut (what it carries stops, and new connections are accepted and left unanswered, as behind
//! a partition), and healed.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::time::Instant;

/// A forwarder on a free port to `127.0.0.1:<target>`, stopped when dropped.
pub struct Link {
    pub port: u16,
    delay_us: Arc<AtomicU64>,
    cut: Arc<AtomicBool>,
    /// Bumped by every cut: the connections of an earlier generation close.
    generation: watch::Sender<u64>,
    task: tokio::task::JoinHandle<()>,
}

impl Link {
    pub async fn start(target: u16) -> Link {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("link binds");
        let port = listener.local_addr().expect("link address").port();
        let delay_us = Arc::new(AtomicU64::new(0));
        let cut = Arc::new(AtomicBool::new(false));
        let (generation, _) = watch::channel(0u64);
        let task = tokio::spawn({
            let (delay_us, cut, generation) = (delay_us.clone(), cut.clone(), generation.clone());
            async move {
                loop {
                    let Ok((client, _)) = listener.accept().await else {
                        continue;
                    };
                    let _ = client.set_nodelay(true);
                    let mut closed = generation.subscribe();
                    let born = *closed.borrow_and_update();
                    let (delay_us, cut) = (delay_us.clone(), cut.clone());
                    tokio::spawn(async move {
                        if cut.load(Ordering::Acquire) {
                            // Behind a partition: accepted, never answered, closed when the link heals or is cut
                            // again.
                            let _ = closed.wait_for(|g| *g != born).await;
                            return;
                        }
                        let Ok(server) = TcpStream::connect(("127.0.0.1", target)).await else {
                            return;
                        };
                        let _ = server.set_nodelay(true);
                        let (cr, cw) = client.into_split();
                        let (sr, sw) = server.into_split();
                        tokio::select! {
                            () = pump(cr, sw, delay_us.clone()) => {}
                            () = pump(sr, cw, delay_us) => {}
                            _ = closed.wait_for(|g| *g != born) => {}
                        }
                    });
                }
            }
        });
        Link {
            port,
            delay_us,
            cut,
            generation,
            task,
        }
    }

    /// A `redis://` URL through the link.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Every byte takes `delay` more to cross, each way (from now on).
    pub fn delay(&self, delay: Duration) {
        self.delay_us.store(delay.as_micros() as u64, Ordering::Release);
    }

    /// Cuts the link: its connections close, and new ones are accepted and left unanswered until it heals.
    pub fn cut(&self) {
        self.cut.store(true, Ordering::Release);
        self.generation.send_modify(|g| *g += 1);
    }

    /// Heals a cut: new connections are carried again (the ones held while cut are closed).
    pub fn heal(&self) {
        self.cut.store(false, Ordering::Release);
        self.generation.send_modify(|g| *g += 1);
    }
}

impl Drop for Link {
    fn drop(&mut self) {
        self.generation.send_modify(|g| *g += 1);
        self.task.abort();
    }
}

/// Carries bytes from `from` to `to`, each chunk written `delay_us` after it was read; order is kept.
async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    delay_us: Arc<AtomicU64>,
) {
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<(Instant, Vec<u8>)>();
    let writer = async move {
        while let Some((due, bytes)) = rx.recv().await {
            tokio::time::sleep_until(due).await;
            if to.write_all(&bytes).await.is_err() {
                return;
            }
        }
    };
    let reader = async move {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            match from.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => {
                    let due = Instant::now() + Duration::from_micros(delay_us.load(Ordering::Acquire));
                    if tx.send((due, buf[..n].to_vec())).is_err() {
                        return;
                    }
                }
            }
        }
    };
    tokio::join!(reader, writer);
}
