//! Authentication of every request: none, bearer token, API key header, custom header set,
//! or OAuth 2.1 JWT access tokens. A session id is never a credential.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use http::{HeaderMap, HeaderName, HeaderValue};
use serde_json::{json, Value};
use toolgate_config::{AuthMode, PolicyConfig};

use super::credentials::{digest, header_set_digest, Credentials};
use super::jwks::{JwksStatus, RemoteJwks};
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
            if n.same_source(o) {
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
            digest: Some(c.subject_digest.clone()),
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
                    digest: None,
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
}
