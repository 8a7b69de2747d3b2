//! Authentication of every request: none, bearer token, API key header, custom header set,
//! or OAuth 2.1 JWT access tokens. A session id is never a credential.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue};
use http_body_util::{BodyExt, Empty, Limited};
use serde_json::{json, Value};
use toolgate_config::{AuthMode, PolicyConfig};

use super::credentials::{digest, header_set_digest, Credentials};
use super::jwt::{self, Expectations, Jwk, TokenError};
use super::time::now_unix;
use super::Identity;

/// Why a request is not authenticated.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AuthError {
    /// No credential was presented.
    #[error("authentication required")]
    Missing,
    /// A credential was presented and is not valid.
    #[error("invalid credential")]
    Invalid,
    /// The credential was valid and has expired.
    #[error("the credential has expired")]
    Expired,
    /// A JWT was refused.
    #[error("{}", .0.message)]
    Token(TokenError),
    /// The token is valid but grants no role here.
    #[error("the token's scopes grant no role on this server")]
    InsufficientScope,
    /// The signing keys could not be obtained.
    #[error("the issuer's keys are unavailable")]
    KeysUnavailable,
}

impl AuthError {
    /// Stable label for audit records and metrics.
    pub fn reason(&self) -> &'static str {
        match self {
            AuthError::Missing => "missing_credentials",
            AuthError::Invalid => "invalid_credentials",
            AuthError::Expired => "expired_credentials",
            AuthError::Token(t) => match t.reason {
                "expired" => "expired_token",
                "audience" => "wrong_audience",
                "issuer" => "wrong_issuer",
                "algorithm" => "bad_algorithm",
                "signature" => "bad_signature",
                _ => "invalid_token",
            },
            AuthError::InsufficientScope => "insufficient_scope",
            AuthError::KeysUnavailable => "keys_unavailable",
        }
    }

    /// A fixed description per reason (never text taken from the request).
    pub fn description(&self) -> &'static str {
        if let AuthError::Token(t) = self {
            match t.reason {
                "unknown_key" => return "no key of the issuer matches the token's kid and algorithm",
                "token_type" => return "the token's typ is not an accepted access token type",
                "crit" => return "the token has critical header parameters that are not understood",
                _ => {}
            }
        }
        match self.reason() {
            "missing_credentials" => "authentication required",
            "expired_credentials" => "the credential has expired",
            "expired_token" => "the token has expired",
            "wrong_audience" => "the token is not meant for this resource",
            "wrong_issuer" => "the token was issued by another issuer",
            "bad_algorithm" => "the token's algorithm is not accepted",
            "bad_signature" => "the token's signature does not verify",
            "insufficient_scope" => "the token's scopes grant no role here",
            "keys_unavailable" => "the issuer's keys are unavailable",
            "invalid_credentials" => "invalid credential",
            _ => "the token is invalid",
        }
    }

    /// 403 for a valid token without a role, 401 otherwise.
    pub fn status(&self) -> http::StatusCode {
        match self {
            AuthError::InsufficientScope => http::StatusCode::FORBIDDEN,
            AuthError::KeysUnavailable => http::StatusCode::SERVICE_UNAVAILABLE,
            _ => http::StatusCode::UNAUTHORIZED,
        }
    }
}

/// Where JWT verification keys come from.
enum Keys {
    Static(Arc<Vec<Jwk>>),
    Remote(Arc<RemoteJwks>),
}

struct OAuth {
    issuer: String,
    resource: String,
    algorithms: Vec<String>,
    token_types: Vec<String>,
    leeway: i64,
    scope_ranks: HashMap<String, usize>,
    default_rank: Option<usize>,
    keys: Keys,
    metadata_url: String,
    metadata_path: String,
    scopes: Vec<String>,
}

/// The authenticator of one config generation.
pub struct Authenticator {
    mode: AuthMode,
    roles: Vec<String>,
    api_key_header: HeaderName,
    /// The header name as configured (for the challenge).
    api_key_header_text: String,
    custom_headers: Vec<HeaderName>,
    credentials: Credentials,
    oauth: Option<OAuth>,
    server_name: String,
}

/// Reads a file referenced by the config (a mounted Secret or ConfigMap).
pub fn read_ref(path: &str, what: &str) -> Result<String, String> {
    std::fs::read_to_string(path).map_err(|e| format!("{what} `{path}`: {e}"))
}

impl Authenticator {
    /// Keeps `old`'s JWKS cache when this generation fetches its keys from the same URL at the
    /// same refresh interval: a reload (every McpTool edit is one) must not throw away the keys
    /// and make every token wait for a fetch, which fails outright while the issuer is down.
    pub fn keep_keys_of(&mut self, old: &Authenticator) {
        let (Some(new), Some(old)) = (self.oauth.as_mut(), old.oauth.as_ref()) else {
            return;
        };
        if let (Keys::Remote(n), Keys::Remote(o)) = (&mut new.keys, &old.keys) {
            if n.url == o.url && n.timing.refresh == o.timing.refresh {
                *n = Arc::clone(o);
            }
        }
    }

    /// Builds the authenticator, reading the credentials and JWKS files it names.
    pub fn new(p: &PolicyConfig, server_name: &str) -> Result<Self, Vec<String>> {
        let a = &p.auth;
        let credentials = match &a.credentials_file {
            Some(path) if a.mode != AuthMode::None && a.mode != AuthMode::Oauth => {
                let text = read_ref(path, "policy.auth.credentialsFile").map_err(|e| vec![e])?;
                Credentials::parse(&text, &p.roles, &a.custom_headers).map_err(|es| {
                    es.into_iter()
                        .map(|e| format!("policy.auth.credentialsFile `{path}`: {e}"))
                        .collect::<Vec<_>>()
                })?
            }
            _ => Credentials::default(),
        };
        let oauth = match (&a.oauth, a.mode) {
            (Some(o), AuthMode::Oauth) => {
                let problems = o.problems();
                if !problems.is_empty() {
                    return Err(problems.iter().map(ToString::to_string).collect());
                }
                let keys = match (&o.jwks_file, &o.jwks_url) {
                    (Some(f), _) => {
                        let text = read_ref(f, "policy.auth.oauth.jwksFile").map_err(|e| vec![e])?;
                        Keys::Static(Arc::new(
                            jwt::parse_jwks(&text)
                                .map_err(|e| vec![format!("policy.auth.oauth.jwksFile `{f}`: {e}")])?,
                        ))
                    }
                    (None, Some(u)) => Keys::Remote(Arc::new(
                        RemoteJwks::new(u, Duration::from_secs(o.jwks_refresh_seconds.max(1))).map_err(|e| vec![e])?,
                    )),
                    (None, None) => return Err(vec!["policy.auth.oauth: set jwksFile or jwksUrl".into()]),
                };
                let rank = |r: &String| p.roles.iter().position(|x| x == r);
                let (metadata_url, metadata_path) = metadata_location(&o.resource);
                Some(OAuth {
                    issuer: o.issuer.clone(),
                    resource: o.resource.clone(),
                    algorithms: o.algorithms.clone(),
                    token_types: o.token_types.clone(),
                    leeway: i64::try_from(o.leeway_seconds).unwrap_or(i64::MAX),
                    scope_ranks: o
                        .scope_roles
                        .iter()
                        .filter_map(|(s, r)| Some((s.clone(), rank(r)?)))
                        .collect(),
                    default_rank: o.default_role.as_ref().and_then(rank),
                    keys,
                    metadata_url,
                    metadata_path,
                    scopes: o.scope_roles.keys().cloned().collect(),
                })
            }
            _ => None,
        };
        let header =
            |h: &str| HeaderName::from_bytes(h.as_bytes()).map_err(|_| vec![format!("`{h}` is not a header name")]);
        Ok(Self {
            mode: a.mode,
            roles: p.roles.clone(),
            api_key_header: header(&a.api_key_header)?,
            api_key_header_text: a.api_key_header.clone(),
            custom_headers: a.custom_headers.iter().map(|h| header(h)).collect::<Result<_, _>>()?,
            credentials,
            oauth,
            server_name: server_name.to_string(),
        })
    }

    /// The configured mode.
    pub fn mode(&self) -> AuthMode {
        self.mode
    }

    /// How fresh the OAuth signing keys from `jwksUrl` are; `None` unless keys come from a URL.
    pub fn jwks_status(&self) -> Option<JwksStatus> {
        match &self.oauth.as_ref()?.keys {
            Keys::Remote(r) => Some(r.status()),
            Keys::Static(_) => None,
        }
    }

    fn identify(&self, d: &[u8; 32]) -> Result<Identity, AuthError> {
        let c = self.credentials.find(d).ok_or(AuthError::Invalid)?;
        if c.expires_at.is_some_and(|e| now_unix() >= e) {
            return Err(AuthError::Expired);
        }
        Ok(Identity {
            subject: c.id.clone(),
            role: c.role.clone(),
            rank: c.rank,
            tools: c.tools.clone(),
            agent: None,
        })
    }

    /// Authenticates one request from its headers.
    pub async fn authenticate(&self, headers: &HeaderMap) -> Result<Identity, AuthError> {
        match self.mode {
            AuthMode::None => Ok(Identity::anonymous(&self.roles)),
            AuthMode::Bearer => {
                let token = bearer(headers).ok_or(AuthError::Missing)?;
                self.identify(&digest(token.as_bytes()))
            }
            AuthMode::ApiKey => {
                let key = headers.get(&self.api_key_header).ok_or(AuthError::Missing)?;
                if key.is_empty() {
                    return Err(AuthError::Missing);
                }
                self.identify(&digest(key.as_bytes()))
            }
            AuthMode::CustomHeaders => {
                let mut values = Vec::with_capacity(self.custom_headers.len());
                for h in &self.custom_headers {
                    let v = headers.get(h).and_then(|v| v.to_str().ok()).ok_or(AuthError::Missing)?;
                    values.push((h.as_str(), v));
                }
                self.identify(&header_set_digest(values.into_iter()))
            }
            AuthMode::Oauth => {
                let o = self.oauth.as_ref().ok_or(AuthError::KeysUnavailable)?;
                let token = bearer(headers).ok_or(AuthError::Missing)?;
                let want = Expectations {
                    issuer: &o.issuer,
                    audience: &o.resource,
                    algorithms: &o.algorithms,
                    token_types: &o.token_types,
                    leeway: o.leeway,
                    now: now_unix(),
                };
                let claims = match &o.keys {
                    Keys::Static(keys) => jwt::verify_token(token, keys, &want).map_err(AuthError::Token)?,
                    Keys::Remote(remote) => {
                        let keys = remote.keys().await.ok_or(AuthError::KeysUnavailable)?;
                        match jwt::verify_token(token, &keys, &want) {
                            Err(e) if e.reason == "unknown_key" => {
                                let kid = jwt::peek_kid(token);
                                match remote.keys_for_unknown_kid(kid.as_deref(), &keys).await {
                                    Some(fresh) => jwt::verify_token(token, &fresh, &want).map_err(AuthError::Token)?,
                                    None => return Err(AuthError::Token(e)),
                                }
                            }
                            other => other.map_err(AuthError::Token)?,
                        }
                    }
                };
                let rank = jwt::scopes(&claims)
                    .iter()
                    .filter_map(|s| o.scope_ranks.get(s))
                    .copied()
                    .max()
                    .or(o.default_rank);
                let rank = rank.ok_or(AuthError::InsufficientScope)?;
                Ok(Identity {
                    subject: claims
                        .get("sub")
                        .and_then(Value::as_str)
                        .unwrap_or_default()
                        .to_string(),
                    role: self.roles[rank].clone(),
                    rank,
                    tools: None,
                    agent: jwt::agent(&claims),
                })
            }
        }
    }

    /// The `WWW-Authenticate` value for a refusal.
    pub fn challenge(&self, err: &AuthError) -> Option<HeaderValue> {
        let text = match self.mode {
            AuthMode::None | AuthMode::CustomHeaders => return None,
            AuthMode::ApiKey => format!(
                "ApiKey realm=\"{}\", header=\"{}\"",
                self.server_name, self.api_key_header_text
            ),
            AuthMode::Bearer => match err {
                AuthError::Missing => format!("Bearer realm=\"{}\"", self.server_name),
                _ => format!("Bearer realm=\"{}\", error=\"invalid_token\"", self.server_name),
            },
            AuthMode::Oauth => {
                let url = self.oauth.as_ref().map_or("", |o| o.metadata_url.as_str());
                match err {
                    AuthError::Missing => format!("Bearer resource_metadata=\"{url}\""),
                    AuthError::InsufficientScope => {
                        let scope = self.oauth.as_ref().map(|o| o.scopes.join(" ")).unwrap_or_default();
                        format!("Bearer resource_metadata=\"{url}\", error=\"insufficient_scope\", scope=\"{scope}\"")
                    }
                    e => format!(
                        "Bearer resource_metadata=\"{url}\", error=\"invalid_token\", error_description=\"{}\"",
                        e.description()
                    ),
                }
            }
        };
        // Nothing the client sent is echoed, so this parses; the bare challenge is the fallback.
        HeaderValue::from_str(&text).ok().or_else(|| match &self.oauth {
            Some(o) => HeaderValue::from_str(&format!("Bearer resource_metadata=\"{}\"", o.metadata_url)).ok(),
            None => Some(HeaderValue::from_static("Bearer")),
        })
    }

    /// The RFC 9728 protected resource metadata and the paths it is served at, in oauth mode.
    pub fn resource_metadata(&self) -> Option<(Value, [&str; 2])> {
        let o = self.oauth.as_ref()?;
        let doc = json!({
            "resource": o.resource,
            "authorization_servers": [o.issuer],
            "bearer_methods_supported": ["header"],
            "scopes_supported": o.scopes,
            "resource_name": self.server_name,
        });
        Some((doc, ["/.well-known/oauth-protected-resource", o.metadata_path.as_str()]))
    }
}

/// `https://h/mcp` → (`https://h/.well-known/oauth-protected-resource/mcp`, its path).
fn metadata_location(resource: &str) -> (String, String) {
    let (scheme, rest) = resource.split_once("://").unwrap_or(("https", resource));
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], rest[i..].trim_end_matches('/')),
        None => (rest, ""),
    };
    let path = format!("/.well-known/oauth-protected-resource{path}");
    (format!("{scheme}://{authority}{path}"), path)
}

pub(crate) fn bearer(headers: &HeaderMap) -> Option<&str> {
    let v = headers.get(http::header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = v.split_once(' ')?;
    (scheme.eq_ignore_ascii_case("bearer") && !token.trim().is_empty()).then(|| token.trim())
}

/// Query parameters that look like credentials; they are refused (they end up in logs).
pub fn credential_in_query(query: &str) -> bool {
    query.split('&').any(|kv| {
        let k = kv.split('=').next().unwrap_or("").to_ascii_lowercase();
        matches!(
            k.as_str(),
            "access_token" | "token" | "api_key" | "apikey" | "key" | "id_token" | "auth"
        )
    })
}

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
    fn new(url: &str, refresh: Duration) -> Result<Self, String> {
        Self::with_timing(url, JwksTiming::new(refresh))
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

    #[test]
    fn metadata_lives_under_well_known_with_the_resource_path() {
        assert_eq!(
            metadata_location("https://mcp.example.com/mcp"),
            (
                "https://mcp.example.com/.well-known/oauth-protected-resource/mcp".into(),
                "/.well-known/oauth-protected-resource/mcp".into()
            )
        );
        assert_eq!(
            metadata_location("http://h:8/").1,
            "/.well-known/oauth-protected-resource"
        );
    }

    #[test]
    fn credentials_in_the_query_are_detected() {
        assert!(credential_in_query("access_token=abc"));
        assert!(credential_in_query("x=1&API_KEY=abc"));
        assert!(!credential_in_query("page=2"));
    }

    #[test]
    fn bearer_tokens_are_read_case_insensitively() {
        let mut h = HeaderMap::new();
        h.insert(http::header::AUTHORIZATION, HeaderValue::from_static("bearer  abc "));
        assert_eq!(bearer(&h), Some("abc"));
        h.insert(http::header::AUTHORIZATION, HeaderValue::from_static("Basic abc"));
        assert_eq!(bearer(&h), None);
    }

    fn oauth_policy(oauth: Value) -> PolicyConfig {
        serde_json::from_value(json!({"auth": {"mode": "oauth", "oauth": oauth}})).unwrap()
    }

    #[test]
    fn a_jwks_url_over_plain_http_is_refused_unless_it_is_loopback() {
        let base = json!({"issuer": "https://issuer.test", "resource": "https://mcp.test/mcp"});
        let with = |k: &str, v: Value| {
            let mut o = base.clone();
            o[k] = v;
            oauth_policy(o)
        };
        let errs = Authenticator::new(&with("jwksUrl", json!("http://issuer.example.com/jwks")), "t")
            .err()
            .expect("refused");
        assert_eq!(errs.len(), 1, "{errs:?}");
        assert!(
            errs[0].starts_with("policy.auth.oauth.jwksUrl: ") && errs[0].contains("https://"),
            "{errs:?}"
        );
        for ok in [
            "https://issuer.example.com/jwks",
            "http://127.0.0.1:9/jwks",
            "http://localhost:9/jwks",
            "http://[::1]:9/jwks",
        ] {
            assert!(Authenticator::new(&with("jwksUrl", json!(ok)), "t").is_ok(), "{ok}");
        }
        let errs = Authenticator::new(&with("tokenTypes", json!([])), "t")
            .err()
            .expect("refused");
        assert!(errs[0].starts_with("policy.auth.oauth.tokenTypes: "), "{errs:?}");
    }

    #[test]
    fn the_leeway_never_wraps() {
        let mut o = json!({"issuer": "https://issuer.test", "resource": "https://mcp.test/mcp", "jwksUrl": "https://issuer.test/jwks"});
        o["leewaySeconds"] = json!(u64::MAX);
        let a = Authenticator::new(&oauth_policy(o), "t").unwrap();
        assert_eq!(a.oauth.unwrap().leeway, i64::MAX);
    }

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
