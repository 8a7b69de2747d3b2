//! `upstream.baseUrl`, parsed as a URL and held to the one shape a service URL needs:
//! `scheme://host[:port][/prefix]`.
//!
//! Every call the proxy makes goes to this host and port, so the value must mean the same
//! thing to every reader: this parser, the HTTP client, a reviewer reading the ConfigMap. Input
//! that readers split differently is refused, not normalised: user info (`user@host`), any `@`
//! in the authority, percent-encoding or backslashes near the host, query and fragment, dot
//! segments, and numeric hosts other than dotted quads (`127.1`, `0x7f.1`, `2130706433` are
//! read as addresses by some resolvers only).
//!
//! Path segments holding `:` are refused too. A service's URL prefix never needs one, and it is
//! the fingerprint of a host and port that ended up in the path: a Service named
//! `127.0.0.1:38080/` once rendered as `http://127.0.0.1:38080/.demo.svc:80`, a well-formed URL
//! whose host is 127.0.0.1, port 38080, and whose path is `/.demo.svc:80`.

use std::net::{Ipv4Addr, Ipv6Addr};

/// A `baseUrl` that passed [`BaseUrl::parse`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BaseUrl {
    /// `http` or `https` (lower case).
    pub scheme: &'static str,
    /// Host as written (lower-cased): a DNS name, a dotted-quad IPv4 address or a bracketed
    /// IPv6 address (`[::1]`).
    pub host: String,
    /// Explicit port, if any.
    pub port: Option<u16>,
    /// Path prefix without a trailing `/`: `""` or `/seg[/seg...]`.
    pub prefix: String,
}

impl BaseUrl {
    /// Parses and checks `text`; the error says what is wrong (for `upstream.baseUrl: ...`).
    pub fn parse(text: &str) -> Result<Self, String> {
        let shown = format!("`{}`", text.escape_debug());
        if text.is_empty() {
            return Err("must not be empty: use `http://host:port[/prefix]`".into());
        }
        if !text.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(format!(
                "{shown} contains whitespace, control or non-ASCII characters: use `http://host:port[/prefix]` in plain ASCII"
            ));
        }
        if text.contains('\\') {
            return Err(format!(
                "{shown} contains a backslash: some URL parsers read `\\` as `/`, which moves the host"
            ));
        }
        if text.contains('#') {
            return Err(format!("{shown} must not have a fragment (`#...`)"));
        }
        if text.contains('?') {
            return Err(format!(
                "{shown} must not have a query (`?...`): put query parameters under a tool's `http.query`"
            ));
        }
        // Cut the text ourselves too, and insist below that the parser saw the same authority:
        // a value two readers split differently is refused.
        let (authority, path) = match text.split_once("://") {
            Some((_, rest)) => rest.split_at(rest.find('/').unwrap_or(rest.len())),
            None => ("", ""),
        };
        if authority.contains('@') {
            return Err(format!(
                "{shown} must not contain user info or any `@` before the path (`user@host`): the host is what follows the `@`, not what a reader sees first"
            ));
        }
        if authority.contains('%') {
            return Err(format!("{shown}: the host and port must not be percent-encoded"));
        }
        let uri: http::Uri = text.parse().map_err(|e| format!("{shown} is not a URL ({e})"))?;
        let scheme = match uri.scheme_str().map(str::to_ascii_lowercase).as_deref() {
            Some("http") => "http",
            Some("https") => "https",
            Some(other) => {
                return Err(format!(
                    "{shown}: scheme `{other}` is not supported: use `http://host:port[/prefix]`"
                ))
            }
            None => {
                return Err(format!(
                    "{shown} must be an absolute URL with a scheme and a host, such as `http://shop-api.shop.svc:8080`"
                ))
            }
        };
        if uri.authority().map(|a| a.as_str()) != Some(authority) || (!path.is_empty() && uri.path() != path) {
            return Err(format!("{shown} must name a host: use `http://host:port[/prefix]`"));
        }
        let (host, port) = split_host_port(authority).map_err(|e| format!("{shown}: {e}"))?;
        check_host(&host).map_err(|e| format!("{shown}: {e}"))?;
        let prefix = check_path(path).map_err(|e| format!("{shown}: {e}"))?;
        Ok(Self {
            scheme,
            host,
            port,
            prefix,
        })
    }

    /// `host[:port]`, as sent in `Host`.
    pub fn authority(&self) -> String {
        match self.port {
            Some(p) => format!("{}:{p}", self.host),
            None => self.host.clone(),
        }
    }
}

fn split_host_port(authority: &str) -> Result<(String, Option<u16>), String> {
    let (host, port) = if let Some(v6) = authority.strip_prefix('[') {
        let (inside, rest) = v6
            .split_once(']')
            .ok_or("an IPv6 host must be written `[addr]`, closed by `]`")?;
        inside
            .parse::<Ipv6Addr>()
            .map_err(|_| format!("`[{inside}]` is not an IPv6 address"))?;
        let port = match rest {
            "" => None,
            r => Some(r.strip_prefix(':').ok_or("only `:port` may follow an IPv6 host")?),
        };
        (format!("[{}]", inside.to_ascii_lowercase()), port)
    } else {
        match authority.split_once(':') {
            Some((h, p)) => (h.to_ascii_lowercase(), Some(p)),
            None => (authority.to_ascii_lowercase(), None),
        }
    };
    if host.is_empty() {
        return Err("must name a host: use `http://host:port[/prefix]`".into());
    }
    let port = match port {
        None => None,
        Some(p) => {
            let n = (!p.is_empty() && p.len() <= 5 && p.bytes().all(|b| b.is_ascii_digit()))
                .then(|| p.parse::<u16>().ok())
                .flatten()
                .filter(|n| *n != 0)
                .ok_or_else(|| format!("port `{p}` must be a number from 1 to 65535"))?;
            Some(n)
        }
    };
    Ok((host, port))
}

fn check_host(host: &str) -> Result<(), String> {
    if host.starts_with('[') {
        return Ok(()); // checked as an IPv6 address already
    }
    let name = host.strip_suffix('.').unwrap_or(host);
    if name.len() > 253 {
        return Err("the host name is longer than 253 characters".into());
    }
    let labels: Vec<&str> = name.split('.').collect();
    for label in &labels {
        if label.is_empty() || label.len() > 63 {
            return Err(format!(
                "`{host}` is not a host name: each dot-separated label must be 1 to 63 characters"
            ));
        }
        if !label
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        {
            return Err(format!(
                "`{host}` is not a host name: use letters, digits, `-` and `.` (or an IP address)"
            ));
        }
        if label.starts_with('-') || label.ends_with('-') {
            return Err(format!(
                "`{host}` is not a host name: a label cannot start or end with `-`"
            ));
        }
    }
    let last = labels.last().copied().unwrap_or("");
    let numeric = last.bytes().all(|b| b.is_ascii_digit()) || last.to_ascii_lowercase().starts_with("0x");
    if numeric && host.parse::<Ipv4Addr>().is_err() {
        return Err(format!(
            "`{host}` looks like an IPv4 address but is not a dotted quad such as `10.0.0.7`: forms like `127.1`, `0x7f.0.0.1` or `2130706433` mean different hosts to different resolvers"
        ));
    }
    Ok(())
}

fn check_path(path: &str) -> Result<String, String> {
    let trimmed = path.strip_suffix('/').unwrap_or(path);
    if trimmed.is_empty() {
        return Ok(String::new());
    }
    for seg in trimmed.split('/').skip(1) {
        if seg.is_empty() {
            return Err("the path prefix must not contain empty segments (`//`)".into());
        }
        if seg == "." || seg == ".." {
            return Err("the path prefix must not contain `.` or `..` segments".into());
        }
        if seg.contains(':') {
            return Err(format!(
                "path segment `{seg}` contains `:`: a service URL prefix never needs one, and a `host:port` in the path means a host name ended up there (a Service named `127.0.0.1:38080/` once rendered as `http://127.0.0.1:38080/.demo.svc:80`, which calls 127.0.0.1:38080)"
            ));
        }
        if seg.contains('%') {
            return Err(format!(
                "path segment `{seg}` must not be percent-encoded (`%2e%2e` is `..` to many servers)"
            ));
        }
        if !seg
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~'))
        {
            return Err(format!(
                "path segment `{seg}` may hold only letters, digits, `-`, `.`, `_` and `~`"
            ));
        }
    }
    Ok(trimmed.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn service_urls_are_accepted_and_split() {
        for (text, scheme, host, port, prefix) in [
            ("http://127.0.0.1:8080", "http", "127.0.0.1", Some(8080), ""),
            ("http://127.0.0.1:8080/", "http", "127.0.0.1", Some(8080), ""),
            ("http://shop-api.demo.svc:80", "http", "shop-api.demo.svc", Some(80), ""),
            (
                "http://shop-api.demo.svc.cluster.local.:80/",
                "http",
                "shop-api.demo.svc.cluster.local.",
                Some(80),
                "",
            ),
            (
                "http://Shop-API.Demo.svc/api/v1/",
                "http",
                "shop-api.demo.svc",
                None,
                "/api/v1",
            ),
            ("HTTP://localhost:9000/x", "http", "localhost", Some(9000), "/x"),
            ("http://my_service:8080", "http", "my_service", Some(8080), ""),
            ("https://api.example.com/v2", "https", "api.example.com", None, "/v2"),
            ("http://[::1]:8080/api", "http", "[::1]", Some(8080), "/api"),
            ("http://[fd00::7]", "http", "[fd00::7]", None, ""),
            (
                "http://10.0.0.7:65535/a.b/c-d/e_f/~g",
                "http",
                "10.0.0.7",
                Some(65535),
                "/a.b/c-d/e_f/~g",
            ),
        ] {
            let u = BaseUrl::parse(text).unwrap_or_else(|e| panic!("{text}: {e}"));
            assert_eq!(
                (u.scheme, u.host.as_str(), u.port, u.prefix.as_str()),
                (scheme, host, port, prefix),
                "{text}"
            );
        }
        assert_eq!(
            BaseUrl::parse("http://[::1]:8080/api").unwrap().authority(),
            "[::1]:8080"
        );
        assert_eq!(BaseUrl::parse("http://svc/").unwrap().authority(), "svc");
    }

    #[test]
    fn urls_that_could_move_the_host_are_refused() {
        let mut wrong = Vec::new();
        for (text, needle) in [
            // The operator used to render this from a Service named `127.0.0.1:38080/`.
            ("http://127.0.0.1:38080/.demo.svc:80", "contains `:`"),
            ("http://127.0.0.1:38080/a/b:c", "contains `:`"),
            ("http://user@evil.example", "user info"),
            ("http://user:pass@evil.example:80/", "user info"),
            ("http://shop-api.demo.svc@evil.example", "user info"),
            ("http://@evil.example", "user info"),
            ("http://a@b@c", "user info"),
            ("http://x/?q=1", "query"),
            ("http://x/?", "query"),
            ("http://x/#frag", "fragment"),
            ("http://x#", "fragment"),
            ("http://x/a/../b", "`..`"),
            ("http://x/..", "`..`"),
            ("http://x/./b", "`.`"),
            ("http://x/a//b", "empty segments"),
            ("http://x/%2e%2e/b", "percent-encoded"),
            ("http://x/a;b", "may hold only"),
            ("http://x/a@b", "may hold only"),
            ("http://%65vil.example", "percent-encoded"),
            ("http://127.0.0.1%2f@evil", "user info"),
            ("http://evil.example%2f.demo.svc", "percent-encoded"),
            ("http://evil\\.demo.svc", "backslash"),
            ("http:\\\\evil.example", "backslash"),
            ("http://x/a\\b", "backslash"),
            ("http:// x", "whitespace"),
            ("http://x /", "whitespace"),
            ("http://x\t/", "whitespace"),
            ("http://x\r\n/", "whitespace"),
            ("http://x\0", "whitespace"),
            ("http://exämple.com", "non-ASCII"),
            (" http://x", "whitespace"),
            ("", "must not be empty"),
            ("http://", "not a URL"),
            ("http:///x", "not a URL"),
            ("http://:80", "host"),
            ("http://:80/", "host"),
            ("http://[]:80", "IPv6"),
            ("http://[::1", "not a URL"),
            ("http://[::g]/", "IPv6"),
            ("http://x:0", "port `0`"),
            ("http://x:65536", "port `65536`"),
            ("http://x:", "port ``"),
            ("http://x:8o", "port `8o`"),
            ("http://127.1:80", "dotted quad"),
            ("http://2130706433", "dotted quad"),
            ("http://0x7f.0.0.1", "dotted quad"),
            ("http://0177.0.0.1", "dotted quad"),
            ("http://127.0.0.1.:80", "dotted quad"),
            ("http://a..b", "label"),
            ("http://.x", "label"),
            ("http://-x.svc", "`-`"),
            ("http://x!y", "host name"),
            ("ftp://x", "scheme `ftp`"),
            ("file:///etc/passwd", "not a URL"),
            ("127.0.0.1:38080", "scheme"),
            ("/api", "scheme"),
            ("shop-api.demo.svc", "scheme"),
            ("http:x", "absolute URL"),
        ] {
            match BaseUrl::parse(text) {
                Err(e) if e.contains(needle) => {}
                other => wrong.push(format!("{text:?}: expected an error with `{needle}`, got {other:?}")),
            }
        }
        assert!(wrong.is_empty(), "{wrong:#?}");
    }
}
