//! The upstream side: mapping arguments to an HTTP request, the pooled client, and shaping
//! the HTTP response into a business outcome.

pub mod mapping;
pub mod pick;
mod pool;
pub mod shape;

use std::time::Duration;

use bytes::Bytes;
use http::uri::{Authority, Scheme};
use http::{HeaderValue, Request, Uri};
use http_body_util::{BodyExt, Full, Limited};
use toolgate_config::{BaseUrl, UpstreamConfig};

use pool::{Conn, Pool};

/// The upstream client could not be built from the config.
#[derive(Debug, thiserror::Error)]
pub enum UpstreamError {
    /// `baseUrl` is not usable.
    #[error("baseUrl `{url}`: {reason}")]
    BaseUrl {
        /// The configured URL.
        url: String,
        /// Why it is not usable.
        reason: String,
    },
}

/// Why an upstream call produced no usable response.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CallError {
    /// No complete response within the tool's timeout.
    #[error("no response within {0:?}")]
    Timeout(Duration),
    /// The connection could not be opened (refused, unreachable, connect timeout).
    #[error("connection failed")]
    Connect,
    /// The connection broke while sending or receiving.
    #[error("transport error")]
    Transport,
    /// The response body was larger than `upstream.maxResponseBytes`.
    #[error("response body larger than {0} bytes")]
    TooLarge(u64),
}

impl CallError {
    /// Stable label for logs and metrics.
    pub fn kind(&self) -> &'static str {
        match self {
            CallError::Timeout(_) => "timeout",
            CallError::Connect => "connect",
            CallError::Transport => "transport",
            CallError::TooLarge(_) => "too_large",
        }
    }
}

/// A complete upstream response.
#[derive(Debug, Clone)]
pub struct UpstreamResponse {
    /// HTTP status.
    pub status: u16,
    /// `Content-Type`, if any.
    pub content_type: Option<HeaderValue>,
    /// The whole body.
    pub body: Bytes,
}

/// Pooled HTTP/1.1 client for one upstream base URL.
pub struct Upstream {
    pool: Pool,
    /// The `Host` header of every request: the base URL's host, and its port unless it is 80.
    host: HeaderValue,
    scheme: Scheme,
    authority: Authority,
    prefix: String,
    max_response_bytes: u64,
}

/// A tool's path and query cannot be joined to the base URL without leaving it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("`{0}` cannot be joined to the upstream base URL")]
pub struct JoinError(pub String);

impl Upstream {
    /// Builds the client for `cfg`.
    pub fn new(cfg: &UpstreamConfig) -> Result<Self, UpstreamError> {
        let bad = |reason: String| UpstreamError::BaseUrl {
            url: cfg.base_url.clone(),
            reason,
        };
        // The same structural parse the config validation runs: scheme, host, port and a clean
        // prefix, nothing else.
        let base = BaseUrl::parse(&cfg.base_url).map_err(bad)?;
        if base.scheme != "http" {
            return Err(bad("only http:// is supported".into()));
        }
        let authority = base
            .authority()
            .parse::<Authority>()
            .map_err(|_| bad("invalid host or port".into()))?;
        let port = base.port.unwrap_or(80);
        let host = match port {
            80 => HeaderValue::from_str(&base.host),
            p => HeaderValue::from_str(&format!("{}:{p}", base.host)),
        }
        .map_err(|_| bad("invalid host".into()))?;
        let pool = Pool::new(
            format!("{}:{port}", base.host),
            Duration::from_millis(cfg.connect_timeout_ms),
            cfg.pool_max_idle,
            Duration::from_millis(cfg.pool_idle_timeout_ms),
        );
        Ok(Self {
            pool,
            host,
            scheme: Scheme::HTTP,
            authority,
            prefix: base.prefix,
            max_response_bytes: cfg.max_response_bytes,
        })
    }

    /// The base URL's `host[:port]`: the authority of every URI [`Upstream::uri`] builds.
    pub fn authority(&self) -> &Authority {
        &self.authority
    }

    /// The base URL's path prefix (`""` or `/seg...`, no trailing `/`).
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// The absolute URI of `path_and_query` (already encoded) below the base URL. The scheme and
    /// authority are always the base URL's: a path that does not start with exactly one `/`
    /// (`//host/...` would read as an authority to some servers), or whose URI would not keep
    /// them, is refused.
    pub fn uri(&self, path_and_query: &str) -> Result<Uri, JoinError> {
        let refuse = || JoinError(path_and_query.to_string());
        if !path_and_query.starts_with('/') || path_and_query.starts_with("//") {
            return Err(refuse());
        }
        let uri = Uri::builder()
            .scheme(self.scheme.clone())
            .authority(self.authority.clone())
            .path_and_query([self.prefix.as_str(), path_and_query].concat())
            .build()
            .map_err(|_| refuse())?;
        if uri.scheme() != Some(&self.scheme) || uri.authority() != Some(&self.authority) {
            return Err(refuse());
        }
        Ok(uri)
    }

    /// Sends `req` (built with an absolute URI from [`Upstream::uri`]) and reads the whole
    /// response within `timeout`.
    pub async fn send(&self, req: Request<Full<Bytes>>, timeout: Duration) -> Result<UpstreamResponse, CallError> {
        match tokio::time::timeout(timeout, self.exchange(origin_form(req, &self.host))).await {
            Ok(r) => r,
            Err(_) => Err(CallError::Timeout(timeout)),
        }
    }

    /// One request and its whole response on a pooled connection (a new one when none is idle).
    /// A request that a reused connection closed before it was written goes out again on
    /// another; one that may have reached the upstream never does.
    async fn exchange(&self, mut req: Request<Full<Bytes>>) -> Result<UpstreamResponse, CallError> {
        loop {
            let (mut conn, reused) = match self.idle_ready().await {
                Some(conn) => (conn, true),
                None => (self.pool.connect().await.map_err(|_| CallError::Connect)?, false),
            };
            let sent = conn.sender().try_send_request(req);
            let limit = self.max_response_bytes;
            let outcome = conn
                .drive(async move {
                    let resp = sent.await.map_err(|mut e| match e.take_message() {
                        Some(unsent) => Failed::Unsent(Box::new(unsent)),
                        None => Failed::Call(CallError::Transport),
                    })?;
                    read_response(resp, limit).await.map_err(Failed::Call)
                })
                .await;
            match outcome {
                Ok(resp) => {
                    self.pool.checkin(conn);
                    return Ok(resp);
                }
                Err(Failed::Unsent(unsent)) if reused => req = *unsent,
                Err(Failed::Unsent(_)) => return Err(CallError::Transport),
                Err(Failed::Call(e)) => return Err(e),
            }
        }
    }

    /// The most recently used idle connection that is still open and takes a request.
    async fn idle_ready(&self) -> Option<Conn> {
        while let Some(mut conn) = self.pool.checkout() {
            if conn.ready().await {
                return Some(conn);
            }
        }
        None
    }
}

/// Why an exchange ended without a response.
enum Failed {
    /// The connection closed before the request was written: it can go out on another.
    Unsent(Box<Request<Full<Bytes>>>),
    /// Anything else.
    Call(CallError),
}

/// `req` as an HTTP/1.1 client sends it to an origin server: the path and query as the request
/// target, the authority in `Host` (unless the request sets its own).
fn origin_form(mut req: Request<Full<Bytes>>, host: &HeaderValue) -> Request<Full<Bytes>> {
    let target = match req.uri().path_and_query() {
        Some(pq) => Uri::from(pq.clone()),
        None => Uri::from_static("/"),
    };
    *req.uri_mut() = target;
    req.headers_mut()
        .entry(http::header::HOST)
        .or_insert_with(|| host.clone());
    req
}

/// The status, `Content-Type` and whole body of `resp`, refusing a body over `limit` bytes.
async fn read_response(resp: http::Response<hyper::body::Incoming>, limit: u64) -> Result<UpstreamResponse, CallError> {
    let status = resp.status().as_u16();
    let content_type = resp.headers().get(http::header::CONTENT_TYPE).cloned();
    if resp
        .headers()
        .get(http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok())
        .is_some_and(|n| n > limit)
    {
        return Err(CallError::TooLarge(limit));
    }
    let body = Limited::new(resp.into_body(), usize::try_from(limit).unwrap_or(usize::MAX))
        .collect()
        .await
        .map_err(|e| {
            if e.downcast_ref::<http_body_util::LengthLimitError>().is_some() {
                CallError::TooLarge(limit)
            } else {
                CallError::Transport
            }
        })?
        .to_bytes();
    Ok(UpstreamResponse {
        status,
        content_type,
        body,
    })
}

#[cfg(test)]
mod tests;
