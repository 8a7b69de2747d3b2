//! Keep-alive HTTP/1.1 connections to the upstream, each driven by the call that uses it.
//!
//! hyper-util's pooled client runs every connection in a task of its own: a call handed its
//! request to that task through a channel, was woken by it with the response head and again
//! for each part of the body, and checked the connection out and back in through a map keyed by
//! the upstream's authority (hashed twice a call). Here a call takes a connection from a stack
//! (the most recently used first, so a few connections stay warm), polls hyper's connection
//! future itself while it waits for the response and reads the body, and puts it back: the
//! whole exchange runs in the calling task, with no hand-over between tasks and no hashing.
//!
//! Nothing polls a connection while it sits idle. One the upstream closed meanwhile is found
//! closed when it is next checked out (polling it reads the end of the stream) and dropped
//! before any request is written to it; one idle past `poolIdleTimeoutMs` is closed by a sweep
//! or at the next checkout, whichever comes first. A connection is pooled only once hyper says it
//! takes another request, so a checkout never waits on one still busy with an earlier exchange.

use std::future::{poll_fn, Future};
use std::net::SocketAddr;
use std::pin::{pin, Pin};
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::task::{Context, Poll, Wake, Waker};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::Full;
use hyper::client::conn::http1::{self, Connection, SendRequest};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

/// The connection's transport.
type Io = TokioIo<TcpStream>;

/// One HTTP/1.1 connection: the request side and the future that drives its I/O.
pub(super) struct Conn {
    tx: SendRequest<Full<Bytes>>,
    /// Dropped as soon as it finishes (the peer closed the connection, or it failed): dropping
    /// hyper's dispatcher hands a request still queued on it back unsent, where keeping a finished
    /// one would leave that request waiting for an answer nothing will give.
    /// Boxed: hyper's connection state is a few hundred bytes, and a `Conn` moves on every
    /// checkout and checkin (callgrind counted a kilobyte of copying per call).
    io: Option<Box<Connection<Io, Full<Bytes>>>>,
    /// What the connection's I/O and its exchange's channels wake.
    wake: Arc<LocalWake>,
    /// `wake` as a [`Waker`].
    waker: Waker,
}

/// The waker a connection and its exchange are polled with. It wakes the task that drives them,
/// except while that task is polling them itself ([`Conn::drive`]): hyper's dispatcher wakes the
/// request's receiver (the answer, each part of the body) from inside that poll, and a task that
/// wakes itself while it runs is rescheduled by tokio as if it yielded, which also wakes an idle
/// worker to steal it. Such a wake only asks the poll loop for another round.
struct LocalWake {
    /// The task driving the connection; none while the connection is idle in the pool.
    task: Mutex<Option<Waker>>,
    /// [`POLLING`] and [`WOKEN`].
    state: AtomicU8,
}

/// The task is polling the connection now: a wake is recorded, not sent.
const POLLING: u8 = 1;
/// A wake came while [`POLLING`].
const WOKEN: u8 = 2;
/// Rounds of one [`Conn::drive`] poll before a wake is handed to the runtime after all (hyper
/// yields to the runtime by waking itself after a long run of work; that must reach the runtime).
const MAX_ROUNDS: usize = 4;

impl Wake for LocalWake {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        if self.state.fetch_or(WOKEN, Ordering::AcqRel) & POLLING == 0 {
            if let Some(task) = self.task.lock().unwrap_or_else(|e| e.into_inner()).as_ref() {
                task.wake_by_ref();
            }
        }
    }
}

impl LocalWake {
    /// The task in `cx` drives the connection from now on, and is polling it.
    fn enter(&self, cx: &Context<'_>) {
        let mut task = self.task.lock().unwrap_or_else(|e| e.into_inner());
        if !task.as_ref().is_some_and(|t| t.will_wake(cx.waker())) {
            *task = Some(cx.waker().clone());
        }
        self.state.store(POLLING, Ordering::Release);
    }
}

impl Conn {
    fn new(tx: SendRequest<Full<Bytes>>, io: Connection<Io, Full<Bytes>>) -> Self {
        let wake = Arc::new(LocalWake {
            task: Mutex::new(None),
            state: AtomicU8::new(0),
        });
        let waker = Waker::from(Arc::clone(&wake));
        Self {
            tx,
            io: Some(Box::new(io)),
            wake,
            waker,
        }
    }

    /// Drives the connection's I/O once.
    fn poll_io(&mut self) {
        if let Some(io) = self.io.as_mut() {
            if Pin::new(&mut **io)
                .poll(&mut Context::from_waker(&self.waker))
                .is_ready()
            {
                self.io = None;
            }
        }
    }

    /// Whether the connection takes a request now. An idle connection does as soon as its I/O has
    /// been polled; one the upstream closed meanwhile (the poll reads the end of the stream) or
    /// one still busy with an earlier exchange does not, and is not waited for.
    fn ready_now(&mut self) -> bool {
        self.poll_io();
        self.io.is_some()
            && matches!(
                self.tx.poll_ready(&mut Context::from_waker(&self.waker)),
                Poll::Ready(Ok(()))
            )
    }

    /// Checked before a request is started on a pooled connection. The calling task drives the
    /// connection from here on; the request is started ([`Conn::sender`]) and driven
    /// ([`Conn::drive`]) in the same poll.
    pub(super) async fn ready(&mut self) -> bool {
        poll_fn(|cx| {
            self.wake.enter(cx);
            Poll::Ready(self.ready_now())
        })
        .await
    }

    /// The request side, to start a request with.
    pub(super) fn sender(&mut self) -> &mut SendRequest<Full<Bytes>> {
        &mut self.tx
    }

    /// Runs `work` (a request started on this connection, and the reading of its response)
    /// while driving the connection's I/O in the same task.
    pub(super) async fn drive<F: Future>(&mut self, work: F) -> F::Output {
        let mut work = pin!(work);
        poll_fn(|cx| {
            self.wake.enter(cx);
            for _ in 0..MAX_ROUNDS {
                self.wake.state.store(POLLING, Ordering::Release);
                // The I/O first, so that what it read is there when the work looks for it.
                self.poll_io();
                if let Poll::Ready(out) = work.as_mut().poll(&mut Context::from_waker(&self.waker)) {
                    self.wake.state.store(0, Ordering::Release);
                    return Poll::Ready(out);
                }
                // From here a wake reaches the task; one that came during the round means the
                // round left work to do.
                if self.wake.state.swap(0, Ordering::AcqRel) & WOKEN == 0 {
                    return Poll::Pending;
                }
            }
            cx.waker().wake_by_ref();
            Poll::Pending
        })
        .await
    }

    /// Readies a connection whose exchange is over for the pool: hyper settles into its idle
    /// state, and no task is woken for it any more (an upstream that closes the idle connection
    /// wakes no one; the next checkout finds it closed). Whether it may serve another request.
    fn settle(&mut self) -> bool {
        *self.wake.task.lock().unwrap_or_else(|e| e.into_inner()) = None;
        self.ready_now()
    }
}

/// An idle connection and when it was put back.
struct Idle {
    conn: Conn,
    since: Instant,
}

/// Connections to one upstream.
pub(super) struct Pool {
    inner: Arc<Inner>,
}

struct Inner {
    /// Oldest first; a checkout takes the newest.
    idle: Mutex<Vec<Idle>>,
    /// `host:port` to connect to (a DNS name is resolved on each new connection).
    addr: String,
    connect_timeout: Duration,
    max_idle: usize,
    idle_timeout: Duration,
    /// Set once a sweep task runs for this pool.
    sweeping: std::sync::atomic::AtomicBool,
}

impl Pool {
    /// A pool for `addr` (`host:port`).
    pub(super) fn new(addr: String, connect_timeout: Duration, max_idle: usize, idle_timeout: Duration) -> Self {
        Self {
            inner: Arc::new(Inner {
                idle: Mutex::new(Vec::new()),
                addr,
                connect_timeout,
                max_idle,
                idle_timeout: idle_timeout.max(Duration::from_millis(1)),
                sweeping: std::sync::atomic::AtomicBool::new(false),
            }),
        }
    }

    /// The most recently used idle connection, if any (expired ones are closed on the way).
    pub(super) fn checkout(&self) -> Option<Conn> {
        let now = Instant::now();
        let mut idle = self.inner.lock();
        let expired = self.inner.expired(&idle, now);
        let stale: Vec<Idle> = idle.drain(..expired).collect();
        let conn = idle.pop().map(|i| i.conn);
        drop(idle);
        // Closing sockets happens outside the lock.
        drop(stale);
        conn
    }

    /// Puts a connection that finished its exchange back, unless it cannot take another request.
    /// A full pool closes its oldest connection to make room.
    pub(super) fn checkin(&self, mut conn: Conn) {
        if self.inner.max_idle == 0 || !conn.settle() {
            return;
        }
        let mut idle = self.inner.lock();
        if idle.len() >= self.inner.max_idle {
            // The oldest makes room: the newest are the warmest.
            let oldest = idle.remove(0);
            idle.push(Idle {
                conn,
                since: Instant::now(),
            });
            drop(idle);
            drop(oldest);
            return;
        }
        idle.push(Idle {
            conn,
            since: Instant::now(),
        });
        drop(idle);
        self.start_sweeping();
    }

    /// Opens a new connection. The name is resolved first (a literal address needs no lookup);
    /// as with hyper-util's connector, the connect timeout is shared out among the addresses it
    /// resolves to, tried in turn, so an unreachable first address leaves time for the next.
    pub(super) async fn connect(&self) -> Result<Conn, std::io::Error> {
        let addrs: Vec<SocketAddr> = tokio::net::lookup_host(self.inner.addr.as_str()).await?.collect();
        let each = self.inner.connect_timeout / u32::try_from(addrs.len().max(1)).unwrap_or(u32::MAX);
        let mut failed = std::io::Error::new(std::io::ErrorKind::NotFound, "the name resolved to no address");
        for addr in addrs {
            match tokio::time::timeout(each, TcpStream::connect(addr)).await {
                Ok(Ok(stream)) => {
                    let _ = stream.set_nodelay(true);
                    let (tx, io) = http1::handshake(TokioIo::new(stream))
                        .await
                        .map_err(std::io::Error::other)?;
                    return Ok(Conn::new(tx, io));
                }
                Ok(Err(e)) => failed = e,
                Err(_) => failed = std::io::Error::new(std::io::ErrorKind::TimedOut, "connect timed out"),
            }
        }
        Err(failed)
    }

    /// Idle connections now (for tests).
    #[cfg(test)]
    pub(super) fn idle_count(&self) -> usize {
        self.inner.lock().len()
    }

    /// Starts the task that closes connections idle past the timeout, once per pool; it ends
    /// with the pool (a config generation that is no longer served).
    fn start_sweeping(&self) {
        if self.inner.sweeping.load(Ordering::Relaxed) || self.inner.sweeping.swap(true, Ordering::Relaxed) {
            return;
        }
        let Ok(handle) = tokio::runtime::Handle::try_current() else {
            self.inner.sweeping.store(false, Ordering::Relaxed);
            return;
        };
        let weak: Weak<Inner> = Arc::downgrade(&self.inner);
        // Every half timeout: no connection stays idle much past it.
        let every = (self.inner.idle_timeout / 2).max(Duration::from_millis(1));
        handle.spawn(async move {
            loop {
                tokio::time::sleep(every).await;
                let Some(inner) = weak.upgrade() else { return };
                let mut idle = inner.lock();
                let expired = inner.expired(&idle, Instant::now());
                let stale: Vec<Idle> = idle.drain(..expired).collect();
                drop(idle);
                drop(stale);
            }
        });
    }
}

impl Inner {
    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Idle>> {
        self.idle.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// How many of the oldest idle connections are past the idle timeout.
    fn expired(&self, idle: &[Idle], now: Instant) -> usize {
        idle.iter()
            .take_while(|i| now.saturating_duration_since(i.since) >= self.idle_timeout)
            .count()
    }
}
