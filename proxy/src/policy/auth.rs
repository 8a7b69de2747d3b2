//! Authentication of every request: none, bearer token, API key header, custom header set,
//! or OAuth 2.1 JWT access tokens. A session id is never a credential.

use std::collections::HashMap;
use std::sync::Arc;
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
                    leeway: o.leeway_seconds as i64,
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
                    leeway: o.leeway,
                    now: now_unix(),
                };
                let claims = match &o.keys {
                    Keys::Static(keys) => jwt::verify_token(token, keys, &want).map_err(AuthError::Token)?,
                    Keys::Remote(remote) => {
                        let keys = remote.keys(false).await.ok_or(AuthError::KeysUnavailable)?;
                        match jwt::verify_token(token, &keys, &want) {
                            Err(e) if e.reason == "unknown_key" => {
                                let fresh = remote.keys(true).await.ok_or(AuthError::KeysUnavailable)?;
                                jwt::verify_token(token, &fresh, &want).map_err(AuthError::Token)?
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

/// The cached keys, when they were fetched, and when a fetch last failed.
#[derive(Default)]
struct JwksState {
    keys: Option<Arc<Vec<Jwk>>>,
    fetched: Option<Instant>,
    failed: Option<Instant>,
}

/// A JWKS fetched from a URL, cached, refreshed when stale or when a token names an unknown key
/// (at most once per 30 s).
pub struct RemoteJwks {
    url: http::Uri,
    refresh: Duration,
    client: hyper_util::client::legacy::Client<
        hyper_rustls::HttpsConnector<hyper_util::client::legacy::connect::HttpConnector>,
        Empty<Bytes>,
    >,
    state: tokio::sync::Mutex<JwksState>,
}

impl RemoteJwks {
    fn new(url: &str, refresh: Duration) -> Result<Self, String> {
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
            refresh,
            client,
            state: tokio::sync::Mutex::new(JwksState::default()),
        })
    }

    async fn fetch(&self) -> Result<Vec<Jwk>, String> {
        let req = http::Request::get(self.url.clone())
            .body(Empty::new())
            .map_err(|e| e.to_string())?;
        let resp = tokio::time::timeout(Duration::from_secs(5), self.client.request(req))
            .await
            .map_err(|_| "timed out".to_string())?
            .map_err(|e| e.to_string())?;
        if !resp.status().is_success() {
            return Err(format!("HTTP {}", resp.status()));
        }
        let body = Limited::new(resp.into_body(), 1 << 20)
            .collect()
            .await
            .map_err(|e| e.to_string())?
            .to_bytes();
        jwt::parse_jwks(&String::from_utf8_lossy(&body))
    }

    /// The keys; `force` (an unknown `kid`) refetches unless the last fetch was under
    /// min(30 s, refresh interval) ago.
    pub async fn keys(&self, force: bool) -> Option<Arc<Vec<Jwk>>> {
        let mut state = self.state.lock().await;
        let age = state.fetched.map(|t| t.elapsed());
        let stale = match age {
            None => true,
            Some(a) if force => a >= self.refresh.min(Duration::from_secs(30)),
            Some(a) => a >= self.refresh,
        };
        // After a failed fetch, wait 5 s before the next attempt (whatever asked for it).
        let backing_off = state.failed.is_some_and(|t| t.elapsed() < Duration::from_secs(5));
        if stale && !backing_off {
            match self.fetch().await {
                Ok(keys) => {
                    state.keys = Some(Arc::new(keys));
                    state.fetched = Some(Instant::now());
                    state.failed = None;
                }
                Err(e) => {
                    state.failed = Some(Instant::now());
                    tracing::warn!(url = %self.url, error = %e, "JWKS fetch failed; keeping the previous keys, retrying in 5 s");
                }
            }
        }
        state.keys.clone()
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
}
