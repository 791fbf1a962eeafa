//! The TCP side of `serve`: at most `max_connections` open at once (the
//! rest wait in the kernel's backlog), at most `max_per_address` of them
//! from one client address (more are closed as they arrive, so one
//! address cannot take every slot; a trusted proxy's address, which
//! speaks for many clients, is not counted; an IPv6 client is its /64), a
//! connection that sends nothing for `read_idle` is closed, and a
//! request's headers must all arrive within `header_deadline` of its first
//! byte, so half-sent requests cannot hold file descriptors or slots, not
//! even one byte at a time (a slow-header attack). Websockets stay busy:
//! the server pings every 20 s and clients answer.

use axum::serve::Listener;
use std::collections::HashMap;
use std::future::Future;
use std::io;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::{Instant, Sleep};

/// Connection limits.
#[derive(Clone, Debug)]
pub struct ConnectionLimits {
    pub max_connections: usize,
    /// The most connections one client address may hold (0: no limit).
    pub max_per_address: usize,
    /// Addresses that speak for many clients (trusted reverse proxies):
    /// not limited per address.
    pub shared: Vec<ipnet::IpNet>,
    pub read_idle: Duration,
    /// How long a request's headers may take to arrive, from its first
    /// byte (the connection's first request: from when it was accepted).
    pub header_deadline: Duration,
}

impl Default for ConnectionLimits {
    fn default() -> Self {
        ConnectionLimits {
            max_connections: 1024,
            max_per_address: 256,
            shared: Vec::new(),
            read_idle: Duration::from_secs(60),
            header_deadline: Duration::from_secs(15),
        }
    }
}

/// A listener that hands out at most `max_connections` connections, at
/// most `max_per_address` to one address.
pub struct Capped<L> {
    inner: L,
    permits: Arc<Semaphore>,
    addresses: Arc<Addresses>,
    read_idle: Duration,
    header_deadline: Duration,
}

impl<L> Capped<L> {
    pub fn new(inner: L, limits: ConnectionLimits) -> Self {
        Capped {
            inner,
            permits: Arc::new(Semaphore::new(limits.max_connections.max(1))),
            addresses: Arc::new(Addresses {
                open: Mutex::new(HashMap::new()),
                max: limits.max_per_address,
                shared: limits.shared,
            }),
            read_idle: limits.read_idle,
            header_deadline: limits.header_deadline,
        }
    }
}

/// The connections open per client (an IPv4 address, an IPv6 /64).
struct Addresses {
    open: Mutex<HashMap<IpAddr, usize>>,
    max: usize,
    shared: Vec<ipnet::IpNet>,
}

impl Addresses {
    /// A slot for one more connection from `ip`, unless it holds its most.
    fn admit(self: &Arc<Self>, ip: IpAddr) -> Option<AddressSlot> {
        if self.max == 0 || self.shared.iter().any(|n| n.contains(&ip)) {
            return Some(AddressSlot(None));
        }
        let ip = crate::network::client_key(ip);
        let mut open = self.open.lock().expect("addresses lock");
        let n = open.entry(ip).or_insert(0);
        if *n >= self.max {
            return None;
        }
        *n += 1;
        Some(AddressSlot(Some((self.clone(), ip))))
    }
}

/// One connection's place in its address's count, given back on drop.
struct AddressSlot(Option<(Arc<Addresses>, IpAddr)>);

impl Drop for AddressSlot {
    fn drop(&mut self) {
        let Some((addresses, ip)) = self.0.take() else {
            return;
        };
        let mut open = addresses.open.lock().expect("addresses lock");
        if let Some(n) = open.get_mut(&ip) {
            *n -= 1;
            if *n == 0 {
                open.remove(&ip);
            }
        }
    }
}

impl<L> Listener for Capped<L>
where
    L: Listener<Addr = std::net::SocketAddr>,
    L::Io: Unpin,
{
    type Io = Guarded<L::Io>;
    type Addr = L::Addr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        loop {
            let permit = self
                .permits
                .clone()
                .acquire_owned()
                .await
                .expect("the semaphore is never closed");
            let (io, addr) = self.inner.accept().await;
            // Over its address's share: closed at once, its slot freed.
            let Some(slot) = self.addresses.admit(addr.ip()) else {
                tracing::debug!(client = %addr.ip(), "connection closed: its address holds its most");
                continue;
            };
            let idle = Box::pin(tokio::time::sleep(self.read_idle));
            let io = Guarded {
                io,
                idle,
                read_idle: self.read_idle,
                headers: Headers::new(self.header_deadline),
                _permit: permit,
                _slot: slot,
            };
            return (io, addr);
        }
    }

    fn local_addr(&self) -> io::Result<Self::Addr> {
        self.inner.local_addr()
    }
}

/// One connection: it holds its slot until dropped, and reading fails once
/// nothing arrived for `read_idle`, or a request's headers took longer
/// than their deadline.
pub struct Guarded<T> {
    io: T,
    idle: Pin<Box<Sleep>>,
    read_idle: Duration,
    headers: Headers,
    _permit: OwnedSemaphorePermit,
    _slot: AddressSlot,
}

/// Where a connection's requests stand: a request's headers arriving (with
/// their deadline), or between requests; none once the connection is a
/// websocket.
struct Headers {
    deadline: Duration,
    /// Armed while a request's headers arrive.
    due: Option<Pin<Box<Sleep>>>,
    /// The last bytes read, for a blank line split across reads.
    tail: [u8; 3],
    /// The server answered 101: the connection speaks websocket now.
    upgraded: bool,
}

impl Headers {
    /// A new connection: its first request is due at once.
    fn new(deadline: Duration) -> Headers {
        Headers {
            deadline,
            due: Some(Box::pin(tokio::time::sleep(deadline))),
            tail: [0; 3],
            upgraded: false,
        }
    }

    /// Bytes read: a request begins (its deadline armed) or its headers
    /// end at a blank line (disarmed).
    fn read(&mut self, bytes: &[u8]) {
        if self.upgraded {
            return;
        }
        for &b in bytes {
            if self.due.is_none() {
                self.due = Some(Box::pin(tokio::time::sleep(self.deadline)));
            }
            let ends = self.tail == *b"\r\n\r" && b == b'\n';
            self.tail = [self.tail[1], self.tail[2], b];
            if ends {
                self.due = None;
                self.tail = [0; 3];
            }
        }
    }

    /// Bytes the server writes: an answer of 101 makes it a websocket.
    fn wrote(&mut self, bytes: &[u8]) {
        if !self.upgraded && bytes.starts_with(b"HTTP/1.1 101") {
            self.upgraded = true;
            self.due = None;
        }
    }

    /// Whether the headers under way are past their deadline.
    fn poll_late(&mut self, cx: &mut Context<'_>) -> bool {
        self.due
            .as_mut()
            .is_some_and(|due| due.as_mut().poll(cx).is_ready())
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for Guarded<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        match Pin::new(&mut self.io).poll_read(cx, buf) {
            Poll::Ready(result) => {
                if buf.filled().len() > before {
                    let deadline = Instant::now() + self.read_idle;
                    self.idle.as_mut().reset(deadline);
                    let this = &mut *self;
                    this.headers.read(&buf.filled()[before..]);
                }
                Poll::Ready(result)
            }
            Poll::Pending if self.headers.poll_late(cx) => Poll::Ready(Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "the request's headers did not all arrive in time",
            ))),
            Poll::Pending => match self.idle.as_mut().poll(cx) {
                Poll::Ready(()) => Poll::Ready(Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "the client sent nothing for too long",
                ))),
                Poll::Pending => Poll::Pending,
            },
        }
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Guarded<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.headers.wrote(buf);
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

/// The client's address, as handlers see it (`ConnectInfo<Peer>`).
#[derive(Clone, Copy, Debug)]
pub struct Peer(pub std::net::SocketAddr);

impl<L> axum::extract::connect_info::Connected<axum::serve::IncomingStream<'_, Capped<L>>> for Peer
where
    L: Listener<Addr = std::net::SocketAddr>,
    L::Io: Unpin,
{
    fn connect_info(stream: axum::serve::IncomingStream<'_, Capped<L>>) -> Self {
        Peer(*stream.remote_addr())
    }
}
