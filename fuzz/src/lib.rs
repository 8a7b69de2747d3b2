//! Fuzz targets for every parser of `toolgate-proxy` that sees bytes from outside: JSON-RPC
//! over HTTP in both protocol eras, the config and credentials files, path templates and the
//! mapping of arguments into a request, JSON pointers, `X-Forwarded-For` and CIDRs, W3C trace
//! context, JWTs and JWKS documents, sealed session ids, and the argument validator.
//!
//! Each target is a plain `fn(&[u8])` that panics when a property does not hold. The same
//! functions run two ways:
//! - under libFuzzer, coverage-guided, with `cargo +nightly fuzz run TARGET --features libfuzzer`
//!   (`fuzz_targets/`, one binary per target; see `fuzz/run.sh`);
//! - on stable as ordinary tests (`tests/corpora.rs`): every checked-in corpus and regression
//!   input, then a time-boxed mutation loop without coverage (`TOOLGATE_FUZZ_SECONDS`), so CI
//!   never depends on a nightly toolchain.

#![forbid(unsafe_code)]

pub mod http;
pub mod mutate;
pub mod seeds;
pub mod targets;

/// A fuzz target: panics when a property fails.
pub type Target = fn(&[u8]);

/// Every target by name (the names of `fuzz_targets/*.rs` and `corpus/*`).
pub const TARGETS: &[(&str, Target)] = &[
    ("http_mcp", http::http_mcp),
    ("jsonrpc_scan", targets::jsonrpc_scan),
    ("config", targets::config),
    ("credentials", targets::credentials),
    ("mapping", targets::mapping),
    ("pointer", targets::pointer),
    ("client_ip", targets::client_ip),
    ("trace_context", targets::trace_context),
    ("jwt", targets::jwt),
    ("jwks", targets::jwks),
    ("session_id", targets::session_id),
    ("validator", targets::validator),
];

/// The target called `name`.
pub fn target(name: &str) -> Option<Target> {
    TARGETS.iter().find(|(n, _)| *n == name).map(|(_, t)| *t)
}

/// `data` as text, lossily: most targets parse text, and libFuzzer's bytes are arbitrary.
pub(crate) fn text(data: &[u8]) -> std::borrow::Cow<'_, str> {
    String::from_utf8_lossy(data)
}

/// Splits `data` at the first `\n`: (first line, rest).
pub(crate) fn split_line(data: &str) -> (&str, &str) {
    data.split_once('\n').unwrap_or((data, ""))
}
