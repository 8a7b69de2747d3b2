//! A remote JWKS: fetched with a deadline and a size bound, cached, refreshed in the background,
//! refetched for an unknown `kid` at a bounded rate, and never refetched during a fetch or the
//! backoff after a failed one.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Empty, Limited};

use super::credentials::digest;
use super::jwt::{self, Jwk};
use super::time::now_unix;

/// How the JWKS cache paces its fetches.
#[derive(Debug, Clone, Copy)]
struct JwksTiming {
    /// Keys older than this are refetched in the background (`jwksRefreshSeconds`).
    refresh: Duration,
    /// Unknown-`kid` refetches overall: at most one per this (min(30 s, refresh)).
    unknown_kid_gap: Duration,
    /// One `kid` triggers at most one refetch per this (refresh).
    per_kid: Duration,
    /// After a failed fetch, nothing is fetched for this long.
    backoff: Duration,
    /// One fetch, from connecting to the last byte of the body.
    deadline: Duration,
}

impl JwksTiming {
    fn new(refresh: Duration) -> Self {
        Self {
            refresh,
            unknown_kid_gap: refresh.min(Duration::from_secs(30)),
            per_kid: refresh,
            backoff: Duration::from_secs(5),
            deadline: JWKS_FETCH_DEADLINE,
        }
    }
}

/// The whole JWKS fetch (connect, headers and body) must finish within this.
pub const JWKS_FETCH_DEADLINE: Duration = Duration::from_secs(5);

/// Largest JWKS document read.
const MAX_JWKS_BYTES: usize = 1 << 20;

/// Unknown `kid`s remembered for their refetch limit; beyond this the oldest is forgotten.
const MAX_REMEMBERED_KIDS: usize = 256;

/// The cache: keys, fetch times, the fetch in flight, unknown `kid`s that asked for a refetch.
/// Held only for snapshots and updates, never across I/O.
#[derive(Default)]
struct JwksState {
    keys: Option<Arc<Vec<Jwk>>>,
    /// Last successful fetch (monotonic, and Unix seconds).
    fetched: Option<Instant>,
    fetched_unix: Option<i64>,
    /// Start of the last fetch an unknown `kid` asked for.
    kid_fetch: Option<Instant>,
    /// Last failed fetch, its reason, and failures since the last success.
    failed: Option<Instant>,
    last_error: Option<&'static str>,
    failures: u64,
    /// A fetch is running; `completed` counts finished fetches (the one in flight is
    /// number `completed + 1`).
    in_flight: bool,
    completed: u64,
    /// SHA-256 of unknown `kid`s → when they last triggered a refetch.
    kids: HashMap<[u8; 32], Instant>,
}

impl JwksState {
    fn backing_off(&self, now: Instant, t: &JwksTiming) -> bool {
        self.failed
            .is_some_and(|f| now.saturating_duration_since(f) < t.backoff)
    }

    /// Whether a token naming the unknown `kid` may start a refetch now.
    fn unknown_kid_may_fetch(&self, kid: &[u8; 32], now: Instant, t: &JwksTiming) -> bool {
        let kid_recent = self
            .kids
            .get(kid)
            .is_some_and(|at| now.saturating_duration_since(*at) < t.per_kid);
        let fetch_recent = self
            .kid_fetch
            .is_some_and(|s| now.saturating_duration_since(s) < t.unknown_kid_gap);
        !self.in_flight && !kid_recent && !fetch_recent && !self.backing_off(now, t)
    }

    /// Records that the unknown `kid` starts a refetch now.
    fn note_kid_fetch(&mut self, kid: [u8; 32], now: Instant, t: &JwksTiming) {
        self.kid_fetch = Some(now);
        self.kids.retain(|_, at| now.saturating_duration_since(*at) < t.per_kid);
        while self.kids.len() >= MAX_REMEMBERED_KIDS {
            let Some(oldest) = self.kids.iter().min_by_key(|(_, at)| **at).map(|(k, _)| *k) else {
                break;
            };
            self.kids.remove(&oldest);
        }
        self.kids.insert(kid, now);
    }
}

/// How fresh the keys fetched from `jwksUrl` are (for `/readyz` and diagnostics).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct JwksStatus {
    /// Keys in the cache (0: none fetched yet; every token is refused with 503).
    pub keys: usize,
    /// Seconds since the keys were last fetched; `None`: never.
    pub age_seconds: Option<u64>,
    /// Unix time of the last successful fetch.
    pub last_success_unix: Option<i64>,
    /// Reason of the last failed fetch since then (`timeout`, `transport`, `status`,
    /// `too_large`, `invalid`); `None` when the last fetch succeeded.
    pub last_error: Option<&'static str>,
    /// Failed fetches since the last success.
    pub consecutive_failures: u64,
    /// A fetch is running.
    pub refreshing: bool,
    /// `jwksRefreshSeconds`: keys older than this are being refetched.
    pub refresh_seconds: u64,
}

/// Why a fetch failed: a bounded label and a detail for the log.
#[derive(Debug)]
struct FetchError {
    reason: &'static str,
    detail: String,
}

impl FetchError {
    fn new(reason: &'static str, detail: impl ToString) -> Self {
        Self {
            reason,
            detail: detail.to_string(),
        }
    }
}

/// A JWKS fetched from a URL and cached. Requests never wait on a fetch while there are keys
/// whose `kid` they name: refreshes run in the background, one at a time, each bounded by
/// [`JWKS_FETCH_DEADLINE`] for headers and body together. Requests that need a fetch (no
/// keys yet, or an unknown `kid`) wait for that one fetch instead of starting their own.
pub struct RemoteJwks {
    url: http::Uri,
    timing: JwksTiming,
    client: hyper_util::client::legacy::Client<
        hyper_rustls::HttpsConnector<hyper_util::client::legacy::connect::HttpConnector>,
        Empty<Bytes>,
    >,
    state: Mutex<JwksState>,
    /// The number of finished fetches, for those waiting on one.
    done: tokio::sync::watch::Sender<u64>,
}

/// Marks the fetch finished however its task ends (result, panic or runtime shutdown).
struct Fetching<'a> {
    jwks: &'a RemoteJwks,
    result: Option<Result<Vec<Jwk>, FetchError>>,
}

impl Drop for Fetching<'_> {
    fn drop(&mut self) {
        let result = self
            .result
            .take()
            .unwrap_or_else(|| Err(FetchError::new("transport", "the fetch was abandoned")));
        self.jwks.finish(result);
    }
}

impl RemoteJwks {
    pub(super) fn new(url: &str, refresh: Duration) -> Result<Self, String> {
        Self::with_timing(url, JwksTiming::new(refresh))
    }

    /// Whether `other` fetches the same URL on the same refresh interval (a reload keeps the
    /// cached keys then).
    pub(super) fn same_source(&self, other: &Self) -> bool {
        self.url == other.url && self.timing.refresh == other.timing.refresh
    }

    fn with_timing(url: &str, timing: JwksTiming) -> Result<Self, String> {
        let uri: http::Uri = url
            .parse()
            .map_err(|_| format!("policy.auth.oauth.jwksUrl `{url}` is not a URL"))?;
        let https = hyper_rustls::HttpsConnectorBuilder::new()
            .with_native_roots()
            .map_err(|e| format!("policy.auth.oauth.jwksUrl: no TLS roots: {e}"))?
            .https_or_http()
            .enable_http1()
            .build();
        let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new()).build(https);
        Ok(Self {
            url: uri,
            timing,
            client,
            state: Mutex::new(JwksState::default()),
            done: tokio::sync::watch::channel(0).0,
        })
    }

    fn state(&self) -> MutexGuard<'_, JwksState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    async fn fetch(&self) -> Result<Vec<Jwk>, FetchError> {
        let req = http::Request::get(self.url.clone())
            .header(http::header::ACCEPT, "application/jwk-set+json, application/json")
            .body(Empty::new())
            .map_err(|e| FetchError::new("transport", e))?;
        let resp = self
            .client
            .request(req)
            .await
            .map_err(|e| FetchError::new("transport", e))?;
        if !resp.status().is_success() {
            return Err(FetchError::new("status", format!("HTTP {}", resp.status())));
        }
        let body = Limited::new(resp.into_body(), MAX_JWKS_BYTES)
            .collect()
            .await
            .map_err(|e| {
                if e.is::<http_body_util::LengthLimitError>() {
                    FetchError::new("too_large", format!("the JWKS is larger than {MAX_JWKS_BYTES} bytes"))
                } else {
                    FetchError::new("transport", e)
                }
            })?
            .to_bytes();
        jwt::parse_jwks(&String::from_utf8_lossy(&body)).map_err(|e| FetchError::new("invalid", e))
    }

    /// Starts the one fetch (the caller checked that none is in flight), holding the lock only
    /// to mark it started.
    fn start_fetch(self: &Arc<Self>, st: &mut JwksState) {
        st.in_flight = true;
        let me = Arc::clone(self);
        tokio::spawn(async move {
            let mut fetching = Fetching {
                jwks: &me,
                result: None,
            };
            let result = tokio::time::timeout(me.timing.deadline, me.fetch())
                .await
                .unwrap_or_else(|_| {
                    Err(FetchError::new(
                        "timeout",
                        format!("no complete response within {} s", me.timing.deadline.as_secs_f64()),
                    ))
                });
            fetching.result = Some(result);
        });
    }

    fn finish(&self, result: Result<Vec<Jwk>, FetchError>) {
        let now = Instant::now();
        let unix = now_unix();
        let (completed, error) = {
            let mut st = self.state();
            st.in_flight = false;
            st.completed += 1;
            let error = match result {
                Ok(keys) => {
                    st.keys = Some(Arc::new(keys));
                    st.fetched = Some(now);
                    st.fetched_unix = Some(unix);
                    st.failed = None;
                    st.last_error = None;
                    st.failures = 0;
                    None
                }
                Err(e) => {
                    st.failed = Some(now);
                    st.last_error = Some(e.reason);
                    st.failures += 1;
                    Some((e, st.keys.is_some()))
                }
            };
            (st.completed, error)
        };
        let m = &crate::metrics::METRICS;
        match error {
            None => m.jwks_last_success.set(unix),
            Some((e, kept)) => {
                m.jwks_fetch_failures.with_label_values(&[e.reason]).inc();
                tracing::warn!(url = %self.url, reason = e.reason, error = %e.detail, keeping_previous_keys = kept,
                    "JWKS fetch failed; retrying in {} s at the earliest", self.timing.backoff.as_secs());
            }
        }
        self.done.send_replace(completed);
    }

    /// Waits (bounded by the fetch deadline) until fetch number `target` has finished.
    async fn wait_for(&self, target: u64) {
        let mut rx = self.done.subscribe();
        let bound = self.timing.deadline + Duration::from_secs(1);
        let _ = tokio::time::timeout(bound, rx.wait_for(|n| *n >= target)).await;
    }

    /// The cached keys. When there are none yet, waits for the one fetch of them; when they
    /// are older than the refresh interval, starts a background refresh and returns them.
    pub async fn keys(self: &Arc<Self>) -> Option<Arc<Vec<Jwk>>> {
        let now = Instant::now();
        let target = {
            let mut st = self.state();
            let stale = st
                .fetched
                .is_none_or(|t| now.saturating_duration_since(t) >= self.timing.refresh);
            if stale && !st.in_flight && !st.backing_off(now, &self.timing) {
                self.start_fetch(&mut st);
            }
            match &st.keys {
                Some(keys) => return Some(Arc::clone(keys)),
                None if st.in_flight => st.completed + 1,
                None => return None,
            }
        };
        self.wait_for(target).await;
        self.state().keys.clone()
    }

    /// Keys newer than `seen`, for a token whose `kid` is not among `seen`: joins the fetch in
    /// flight, or starts one unless this `kid` asked within the refresh interval, any unknown
    /// `kid` did within min(30 s, refresh), or the last fetch failed under 5 s ago. `None`:
    /// nothing newer (the token is refused).
    pub async fn keys_for_unknown_kid(
        self: &Arc<Self>,
        kid: Option<&str>,
        seen: &Arc<Vec<Jwk>>,
    ) -> Option<Arc<Vec<Jwk>>> {
        let now = Instant::now();
        let kid = digest(kid.unwrap_or("").as_bytes());
        let target = {
            let mut st = self.state();
            if let Some(newer) = st.keys.as_ref().filter(|k| !Arc::ptr_eq(k, seen)) {
                return Some(Arc::clone(newer));
            }
            if !st.in_flight {
                if !st.unknown_kid_may_fetch(&kid, now, &self.timing) {
                    return None;
                }
                st.note_kid_fetch(kid, now, &self.timing);
                self.start_fetch(&mut st);
            }
            st.completed + 1
        };
        self.wait_for(target).await;
        self.state().keys.clone().filter(|k| !Arc::ptr_eq(k, seen))
    }

    /// How fresh the keys are.
    pub fn status(&self) -> JwksStatus {
        let st = self.state();
        JwksStatus {
            keys: st.keys.as_ref().map_or(0, |k| k.len()),
            age_seconds: st.fetched.map(|t| t.elapsed().as_secs()),
            last_success_unix: st.fetched_unix,
            last_error: st.last_error,
            consecutive_failures: st.failures,
            refreshing: st.in_flight,
            refresh_seconds: self.timing.refresh.as_secs(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn timing(refresh_s: u64) -> JwksTiming {
        JwksTiming::new(Duration::from_secs(refresh_s))
    }

    #[test]
    fn an_unknown_kid_refetches_at_most_once_per_interval_and_never_during_a_fetch_or_backoff() {
        let t = timing(300);
        assert_eq!(t.unknown_kid_gap, Duration::from_secs(30));
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        let (a, b) = (digest(b"kid-a"), digest(b"kid-b"));
        let mut st = JwksState::default();
        assert!(st.unknown_kid_may_fetch(&b, t0, &t));
        st.note_kid_fetch(b, t0, &t);
        // An unknown kid asked under min(30 s, refresh) ago: no refetch, whatever the kid.
        assert!(!st.unknown_kid_may_fetch(&a, at(1), &t));
        assert!(!st.unknown_kid_may_fetch(&a, at(29), &t));
        assert!(st.unknown_kid_may_fetch(&a, at(30), &t));
        st.note_kid_fetch(a, at(30), &t);
        // Kid a asked at 30 s: not again until 330 s; kid b (asked at 0 s) not until 300 s;
        // another kid after the overall gap.
        assert!(!st.unknown_kid_may_fetch(&a, at(61), &t));
        assert!(!st.unknown_kid_may_fetch(&b, at(61), &t));
        assert!(st.unknown_kid_may_fetch(&digest(b"kid-c"), at(61), &t));
        assert!(st.unknown_kid_may_fetch(&b, at(300), &t));
        assert!(!st.unknown_kid_may_fetch(&a, at(329), &t));
        assert!(st.unknown_kid_may_fetch(&a, at(330), &t));
        // A fetch in flight is joined, not doubled.
        st.in_flight = true;
        assert!(!st.unknown_kid_may_fetch(&b, at(400), &t));
        st.in_flight = false;
        // After a failed fetch, 5 s of backoff.
        st.failed = Some(at(400));
        assert!(!st.unknown_kid_may_fetch(&b, at(404), &t));
        assert!(st.unknown_kid_may_fetch(&b, at(405), &t));
        assert!(st.backing_off(at(404), &t) && !st.backing_off(at(405), &t));
        // A short refresh interval shortens both limits.
        let quick = timing(2);
        assert_eq!(
            (quick.unknown_kid_gap, quick.per_kid),
            (Duration::from_secs(2), Duration::from_secs(2))
        );
    }

    #[test]
    fn remembered_kids_are_bounded_and_the_oldest_go_first() {
        let t = timing(300);
        let t0 = Instant::now();
        let mut st = JwksState::default();
        for i in 0..1000u64 {
            st.note_kid_fetch(digest(&i.to_be_bytes()), t0 + Duration::from_millis(i), &t);
        }
        assert_eq!(st.kids.len(), MAX_REMEMBERED_KIDS);
        assert!(st.kids.contains_key(&digest(&999u64.to_be_bytes())));
        assert!(!st.kids.contains_key(&digest(&0u64.to_be_bytes())));
        assert!(st
            .kids
            .contains_key(&digest(&(1000 - MAX_REMEMBERED_KIDS as u64).to_be_bytes())));
        // Entries older than the interval are dropped on the next insert.
        st.note_kid_fetch(digest(b"late"), t0 + Duration::from_secs(400), &t);
        assert_eq!(st.kids.len(), 1);
    }
}
