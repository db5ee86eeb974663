//! One remotedialer session over an established WebSocket: the peer (Rancher) opens connections
//! with Connect frames and sends their bytes as Data frames; each connection becomes a
//! [`TunnelStream`] handed to the acceptor (which serves HTTP/1 on it). One writer task owns the
//! socket's sink: control frames (Pause, Resume, Error, SyncConnections) go before data, a ping
//! goes out every [`PING_INTERVAL`] (the server drops a session it hears nothing from for 60 s),
//! and the active connection ids every [`SYNC_INTERVAL`] so the server can drop stale ones.
//!
//! Back-pressure works both ways, as remotedialer's: past [`MAX_BUFFER`] unread bytes on a
//! connection we send Pause, and Resume once it drains below an eighth of that; a Pause from the
//! peer stops our writes on that connection until its Resume. A peer that ignores our Pause and
//! sends past [`HARD_LIMIT`] loses the connection.

use std::{
    collections::HashMap,
    io,
    pin::Pin,
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, AtomicI64, AtomicUsize, Ordering},
    },
    task::{Context, Poll, ready},
    time::Duration,
};

use bytes::Bytes;
use futures::{SinkExt, Stream, StreamExt};
use tokio::{
    io::{AsyncRead, AsyncWrite, ReadBuf},
    sync::{mpsc, watch},
};
use tokio_stream::wrappers::WatchStream;
use tokio_tungstenite::{WebSocketStream, tungstenite::Message};
use tokio_util::sync::{CancellationToken, PollSender};
use tracing::{debug, info, warn};

use super::{
    TunnelError,
    stats::Stats,
    wire::{self, Frame, Type},
};

/// How often we ping; remotedialer's own client pings every 5 s against the server's 60 s.
pub const PING_INTERVAL: Duration = Duration::from_secs(5);
/// A session that hears nothing (not even a pong) for this long is dead.
pub const READ_TIMEOUT: Duration = Duration::from_secs(60);
/// How often the active connection ids go to the server.
pub const SYNC_INTERVAL: Duration = Duration::from_secs(60);
/// Unread bytes on one connection past which we ask the peer to pause (remotedialer's MaxBuffer).
pub const MAX_BUFFER: usize = 1 << 21;
/// Unread bytes past which a peer that ignores Pause loses the connection.
pub const HARD_LIMIT: usize = 4 * MAX_BUFFER;
/// Largest Data frame we send.
const MAX_FRAME: usize = 32 * 1024;
/// Data frames queued for the socket before writers wait.
const DATA_QUEUE: usize = 64;

/// What the acceptor gets for each connection the peer opens.
pub type Accept = Arc<dyn Fn(TunnelStream) + Send + Sync>;

enum Out {
    Frame(Vec<u8>),
}

enum Inbound {
    Data(Bytes),
    /// The peer closed its side cleanly (Error "EOF").
    Eof,
    Failed(String),
}

struct Conn {
    inbound: mpsc::UnboundedSender<Inbound>,
    buffered: Arc<AtomicUsize>,
    paused_by_us: Arc<AtomicBool>,
    remote_paused: watch::Sender<bool>,
}

struct Shared {
    conns: Mutex<HashMap<i64, Conn>>,
    control: mpsc::UnboundedSender<Out>,
    next_id: AtomicI64,
    stats: Arc<Stats>,
}

impl Shared {
    fn frame(&self, conn_id: i64, kind: Type, payload: Vec<u8>) -> Vec<u8> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        Frame::new(id, conn_id, kind, payload).encode()
    }

    fn control(&self, conn_id: i64, kind: Type, payload: Vec<u8>) {
        // Fails only once the session is over, when nothing needs saying any more.
        let _ = self
            .control
            .send(Out::Frame(self.frame(conn_id, kind, payload)));
    }

    fn conns(&self) -> std::sync::MutexGuard<'_, HashMap<i64, Conn>> {
        // Nothing holding this lock can leave the map inconsistent: a poisoned lock is usable.
        self.conns.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Limits of one session.
#[derive(Clone, Debug)]
pub struct Limits {
    /// Connections open at once; a Connect beyond it is refused with an Error frame.
    pub max_connections: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_connections: 512,
        }
    }
}

/// Serves one session until the socket closes, a frame is malformed, the peer goes silent, or
/// `stop` fires (then the socket is closed cleanly). Every connection still open ends with it.
pub async fn serve<S>(
    ws: WebSocketStream<S>,
    accept: Accept,
    limits: Limits,
    stats: Arc<Stats>,
    stop: CancellationToken,
) -> Result<(), TunnelError>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let (mut sink, mut source) = ws.split();
    let (control_tx, mut control_rx) = mpsc::unbounded_channel::<Out>();
    let (data_tx, mut data_rx) = mpsc::channel::<Out>(DATA_QUEUE);
    let shared = Arc::new(Shared {
        conns: Mutex::new(HashMap::new()),
        control: control_tx,
        next_id: AtomicI64::new(rand::random::<i64>() & 0x3fff_ffff_ffff_ffff),
        stats: stats.clone(),
    });

    let writer_stats = stats.clone();
    let writer = {
        let shared = shared.clone();
        let stop = stop.clone();
        async move {
            let mut ping = tokio::time::interval(PING_INTERVAL);
            let mut sync = tokio::time::interval(SYNC_INTERVAL);
            sync.tick().await;
            loop {
                let msg = tokio::select! {
                    biased;
                    _ = stop.cancelled() => {
                        let _ = sink.send(Message::Close(None)).await;
                        return Ok(());
                    }
                    Some(Out::Frame(f)) = control_rx.recv() => Message::Binary(f.into()),
                    Some(Out::Frame(f)) = data_rx.recv() => Message::Binary(f.into()),
                    _ = ping.tick() => Message::Ping(Bytes::new()),
                    _ = sync.tick() => {
                        let mut ids: Vec<i64> = shared.conns().keys().copied().collect();
                        ids.sort_unstable();
                        Message::Binary(shared.frame(0, Type::SyncConnections, wire::encode_ids(&ids)).into())
                    }
                };
                if let Message::Binary(b) = &msg {
                    writer_stats.frames_out.fetch_add(1, Ordering::Relaxed);
                    writer_stats
                        .bytes_out
                        .fetch_add(b.len() as u64, Ordering::Relaxed);
                }
                sink.send(msg).await.map_err(TunnelError::Socket)?;
            }
        }
    };

    let reader = {
        let shared = shared.clone();
        let stats = stats.clone();
        async move {
            loop {
                let next = tokio::time::timeout(READ_TIMEOUT, source.next()).await;
                let msg = match next {
                    Err(_) => return Err(TunnelError::Silent(READ_TIMEOUT)),
                    Ok(None) => return Err(TunnelError::Closed),
                    Ok(Some(Err(e))) => return Err(TunnelError::Socket(e)),
                    Ok(Some(Ok(m))) => m,
                };
                match msg {
                    Message::Binary(b) => {
                        stats.frames_in.fetch_add(1, Ordering::Relaxed);
                        stats.bytes_in.fetch_add(b.len() as u64, Ordering::Relaxed);
                        let frame = Frame::decode(&b).map_err(TunnelError::Frame)?;
                        on_frame(&shared, frame, &accept, &limits, &data_tx);
                    }
                    // tungstenite answers pings itself; a pong only proves the peer lives.
                    Message::Ping(_) | Message::Pong(_) | Message::Frame(_) => {}
                    Message::Text(_) => return Err(TunnelError::TextMessage),
                    Message::Close(_) => return Err(TunnelError::Closed),
                }
            }
        }
    };

    let result = tokio::select! {
        r = writer => r,
        r = reader => r,
    };
    // Every connection still open ends here: its reader sees the failure, its writer a closed pipe.
    let open: Vec<(i64, Conn)> = shared.conns().drain().collect();
    stats
        .connections
        .fetch_sub(open.len() as u64, Ordering::Relaxed);
    for (_, conn) in open {
        let _ = conn.inbound.send(Inbound::Failed("tunnel closed".into()));
    }
    result
}

fn on_frame(
    shared: &Arc<Shared>,
    frame: Frame,
    accept: &Accept,
    limits: &Limits,
    data_tx: &mpsc::Sender<Out>,
) {
    let id = frame.conn_id;
    match frame.kind {
        Type::Connect => {
            let target = frame.connect_target();
            let refuse = match &target {
                Err(e) => Some(e.to_string()),
                Ok((proto, _)) if proto != "tcp" => Some(format!("protocol {proto} not allowed")),
                Ok(_) if shared.conns().len() >= limits.max_connections => {
                    Some("too many connections".to_string())
                }
                Ok(_) if shared.conns().contains_key(&id) => Some("duplicate connection id".into()),
                Ok(_) => None,
            };
            if let Some(why) = refuse {
                warn!(conn = id, %why, "refused a tunnel connection");
                shared.control(id, Type::Error, why.into_bytes());
                return;
            }
            let (inbound_tx, inbound_rx) = mpsc::unbounded_channel();
            let (remote_paused, paused_rx) = watch::channel(false);
            let buffered = Arc::new(AtomicUsize::new(0));
            let paused_by_us = Arc::new(AtomicBool::new(false));
            shared.conns().insert(
                id,
                Conn {
                    inbound: inbound_tx,
                    buffered: buffered.clone(),
                    paused_by_us: paused_by_us.clone(),
                    remote_paused,
                },
            );
            shared.stats.connections.fetch_add(1, Ordering::Relaxed);
            shared
                .stats
                .connections_total
                .fetch_add(1, Ordering::Relaxed);
            crate::metrics::tunnel_connection();
            debug!(conn = id, "tunnel connection opened");
            accept(TunnelStream {
                id,
                shared: shared.clone(),
                inbound: inbound_rx,
                pending: Bytes::new(),
                read_done: false,
                buffered,
                paused_by_us,
                remote_paused: WatchStream::new(paused_rx),
                is_paused: false,
                data: PollSender::new(data_tx.clone()),
                write_closed: false,
            });
        }
        Type::Data => {
            let conns = shared.conns();
            let Some(conn) = conns.get(&id) else {
                drop(conns);
                shared.control(id, Type::Error, b"connection not found".to_vec());
                return;
            };
            let n = frame.payload.len();
            let now = conn.buffered.fetch_add(n, Ordering::AcqRel) + n;
            if now > HARD_LIMIT {
                drop(conns);
                warn!(
                    conn = id,
                    buffered = now,
                    "the peer ignored Pause; closing the connection"
                );
                close(shared, id, Some("buffer exceeded".into()));
                return;
            }
            if now > MAX_BUFFER && !conn.paused_by_us.swap(true, Ordering::AcqRel) {
                shared.control(id, Type::Pause, Vec::new());
            }
            let _ = conn.inbound.send(Inbound::Data(Bytes::from(frame.payload)));
        }
        Type::Error => {
            let why = wire::error_message(&frame.payload);
            if let Some(conn) = shared.conns().remove(&id) {
                let _ = conn.inbound.send(match why {
                    None => Inbound::Eof,
                    Some(m) => Inbound::Failed(m),
                });
                shared.stats.connections.fetch_sub(1, Ordering::Relaxed);
            }
        }
        Type::Pause | Type::Resume => {
            if let Some(conn) = shared.conns().get(&id) {
                let _ = conn.remote_paused.send(frame.kind == Type::Pause);
            }
        }
        // Peering messages between Rancher replicas, and a server's own sync: nothing for a client.
        Type::AddClient | Type::RemoveClient | Type::SyncConnections => {}
    }
}

/// Ends connection `id` on our side: the peer gets an Error frame (`EOF` when `why` is `None`).
fn close(shared: &Shared, id: i64, why: Option<String>) {
    if let Some(conn) = shared.conns().remove(&id) {
        shared.stats.connections.fetch_sub(1, Ordering::Relaxed);
        let _ = conn.inbound.send(Inbound::Failed(
            why.clone().unwrap_or_else(|| "closed".into()),
        ));
    }
    shared.control(
        id,
        Type::Error,
        why.unwrap_or_else(|| "EOF".into()).into_bytes(),
    );
}

/// One connection the peer opened through the tunnel: a byte stream both ways.
pub struct TunnelStream {
    id: i64,
    shared: Arc<Shared>,
    inbound: mpsc::UnboundedReceiver<Inbound>,
    pending: Bytes,
    read_done: bool,
    buffered: Arc<AtomicUsize>,
    paused_by_us: Arc<AtomicBool>,
    remote_paused: WatchStream<bool>,
    is_paused: bool,
    data: PollSender<Out>,
    write_closed: bool,
}

impl TunnelStream {
    /// The connection's id in the session.
    pub fn id(&self) -> i64 {
        self.id
    }

    fn consumed(&self, n: usize) {
        let left = self.buffered.fetch_sub(n, Ordering::AcqRel) - n;
        if left < MAX_BUFFER / 8 && self.paused_by_us.swap(false, Ordering::AcqRel) {
            self.shared.control(self.id, Type::Resume, Vec::new());
        }
    }
}

impl AsyncRead for TunnelStream {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        loop {
            if !self.pending.is_empty() {
                let n = self.pending.len().min(buf.remaining());
                let chunk = self.pending.split_to(n);
                buf.put_slice(&chunk);
                self.consumed(n);
                return Poll::Ready(Ok(()));
            }
            if self.read_done {
                return Poll::Ready(Ok(()));
            }
            match ready!(self.inbound.poll_recv(cx)) {
                Some(Inbound::Data(b)) => self.pending = b,
                Some(Inbound::Eof) => {
                    self.read_done = true;
                    return Poll::Ready(Ok(()));
                }
                Some(Inbound::Failed(why)) => {
                    self.read_done = true;
                    return Poll::Ready(Err(io::Error::new(io::ErrorKind::ConnectionReset, why)));
                }
                None => {
                    self.read_done = true;
                    return Poll::Ready(Err(io::Error::new(
                        io::ErrorKind::ConnectionReset,
                        "tunnel closed",
                    )));
                }
            }
        }
    }
}

impl AsyncWrite for TunnelStream {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        if self.write_closed {
            return Poll::Ready(Err(io::ErrorKind::BrokenPipe.into()));
        }
        // Waits while the peer has paused this connection.
        loop {
            match Pin::new(&mut self.remote_paused).poll_next(cx) {
                Poll::Ready(Some(paused)) => self.is_paused = paused,
                Poll::Ready(None) => {
                    return Poll::Ready(Err(io::Error::new(
                        io::ErrorKind::BrokenPipe,
                        "tunnel closed",
                    )));
                }
                Poll::Pending => break,
            }
        }
        if self.is_paused {
            return Poll::Pending;
        }
        if ready!(self.data.poll_reserve(cx)).is_err() {
            return Poll::Ready(Err(io::Error::new(
                io::ErrorKind::BrokenPipe,
                "tunnel closed",
            )));
        }
        let n = buf.len().min(MAX_FRAME);
        let frame = self.shared.frame(self.id, Type::Data, buf[..n].to_vec());
        if self.data.send_item(Out::Frame(frame)).is_err() {
            return Poll::Ready(Err(io::Error::new(
                io::ErrorKind::BrokenPipe,
                "tunnel closed",
            )));
        }
        Poll::Ready(Ok(n))
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if !self.write_closed {
            self.write_closed = true;
            // Our side is done writing: remotedialer has no half-close, so the connection ends.
            close(&self.shared, self.id, None);
        }
        Poll::Ready(Ok(()))
    }
}

impl Drop for TunnelStream {
    fn drop(&mut self) {
        if !self.write_closed {
            close(&self.shared, self.id, None);
        }
        debug!(conn = self.id, "tunnel connection closed");
    }
}

/// Logs a session's end at the level it deserves.
pub fn log_end(result: &Result<(), TunnelError>) {
    match result {
        Ok(()) => info!("tunnel session closed"),
        Err(e) => warn!(error = %e, "tunnel session ended"),
    }
}
