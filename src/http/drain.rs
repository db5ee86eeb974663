//! Draining on shutdown, kind to HTTP/1 keep-alive clients.
//!
//! `axum::serve`'s graceful shutdown closes the listener and, at the same moment, every idle
//! keep-alive connection. A client that has just written its next request on such a connection
//! then sees it closed unanswered: harmless (the request was never read) but a failed request all
//! the same. So at the shutdown signal only the listener closes (new connections are refused);
//! connections already open keep being served, each HTTP/1 response now carrying
//! `Connection: close` so the client moves off after it. Once no connection is left, or after a
//! short linger, axum's own graceful shutdown runs: idle connections close, in-flight requests
//! finish (the caller bounds that with `--shutdown-timeout`, counted from the signal).

use std::{future::Future, io, pin::Pin, task, time::Duration};

use axum::{
    Router,
    extract::{Request, State},
    http::{HeaderValue, Version, header},
    middleware::Next,
    response::Response,
    serve::Listener,
};
use futures::FutureExt;
use tokio::{
    io::{AsyncRead, AsyncWrite, ReadBuf},
    sync::watch,
};
use tokio_util::sync::CancellationToken;
use tracing::debug;

/// How long open connections may still bring requests after the signal. Clients that are sending
/// get their `Connection: close` answer within milliseconds; a connection idle for longer is closed
/// like axum would have closed it at once.
pub const LINGER: Duration = Duration::from_secs(1);

/// One shutdown signal, and the count of connections open on the listener it wraps.
#[derive(Clone)]
pub struct Drain {
    shutdown: CancellationToken,
    open: watch::Sender<usize>,
}

impl Drain {
    pub fn new(shutdown: CancellationToken) -> Self {
        Drain {
            shutdown,
            open: watch::Sender::new(0),
        }
    }

    /// `inner`, closed at the shutdown signal, counting the connections it accepted until they end.
    pub fn listener<L>(&self, inner: L) -> io::Result<DrainingListener<L>>
    where
        L: Listener,
        L::Addr: Clone + Sync,
    {
        Ok(DrainingListener {
            local: inner.local_addr()?,
            inner: Some(inner),
            drain: self.clone(),
        })
    }

    /// `router`, whose HTTP/1 responses say `Connection: close` once the signal has come.
    pub fn router(&self, router: Router) -> Router {
        router.layer(axum::middleware::from_fn_with_state(
            self.shutdown.clone(),
            close_when_draining,
        ))
    }

    fn counted<T>(&self, io: T) -> Counted<T> {
        self.open.send_modify(|n| *n += 1);
        Counted {
            io,
            _guard: OpenConnection(self.open.clone()),
        }
    }

    /// The signal for `with_graceful_shutdown`: the shutdown signal, then no open connection or
    /// `linger`, whichever comes first.
    pub fn graceful(&self, linger: Duration) -> impl Future<Output = ()> + Send + 'static {
        let shutdown = self.shutdown.clone();
        let mut open = self.open.subscribe();
        async move {
            shutdown.cancelled().await;
            let emptied = tokio::time::timeout(linger, open.wait_for(|n| *n == 0))
                .await
                .is_ok();
            if !emptied {
                debug!(
                    open = *open.borrow(),
                    "closing the connections still open after the linger"
                );
            }
        }
    }
}

async fn close_when_draining(
    State(shutdown): State<CancellationToken>,
    request: Request,
    next: Next,
) -> Response {
    // HTTP/2 has no Connection header: its graceful shutdown (GOAWAY) tells the client which
    // streams were processed, so nothing is lost there.
    let http1 = request.version() <= Version::HTTP_11;
    let mut response = next.run(request).await;
    if http1 && shutdown.is_cancelled() {
        response
            .headers_mut()
            .insert(header::CONNECTION, HeaderValue::from_static("close"));
    }
    response
}

/// A listener that stops at the shutdown signal and counts its open connections.
pub struct DrainingListener<L: Listener> {
    inner: Option<L>,
    local: L::Addr,
    drain: Drain,
}

impl<L> Listener for DrainingListener<L>
where
    L: Listener,
    L::Addr: Clone + Sync,
{
    type Io = Counted<L::Io>;
    type Addr = L::Addr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        loop {
            let Some(inner) = self.inner.as_mut() else {
                return std::future::pending().await;
            };
            if self.drain.shutdown.is_cancelled() {
                // Connections already waiting (in the kernel's backlog, or past their TLS
                // handshake) are served rather than dropped unread.
                if let Some((io, addr)) = inner.accept().now_or_never() {
                    return (self.drain.counted(io), addr);
                }
                // Dropping the listener closes its socket: from here on, connecting is refused.
                self.inner = None;
                debug!("stopped accepting connections");
                continue;
            }
            let accepted = tokio::select! {
                biased;
                _ = self.drain.shutdown.cancelled() => None,
                conn = inner.accept() => Some(conn),
            };
            if let Some((io, addr)) = accepted {
                return (self.drain.counted(io), addr);
            }
        }
    }

    fn local_addr(&self) -> io::Result<Self::Addr> {
        Ok(self.local.clone())
    }
}

/// Counts one open connection until dropped.
struct OpenConnection(watch::Sender<usize>);

impl Drop for OpenConnection {
    fn drop(&mut self) {
        self.0.send_modify(|n| *n = n.saturating_sub(1));
    }
}

/// A connection's stream, counted as open while it lives.
pub struct Counted<T> {
    io: T,
    _guard: OpenConnection,
}

impl<T: AsyncRead + Unpin> AsyncRead for Counted<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut task::Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> task::Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Counted<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut task::Context<'_>,
        buf: &[u8],
    ) -> task::Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut task::Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> task::Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(
        mut self: Pin<&mut Self>,
        cx: &mut task::Context<'_>,
    ) -> task::Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(
        mut self: Pin<&mut Self>,
        cx: &mut task::Context<'_>,
    ) -> task::Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}
