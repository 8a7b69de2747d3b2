//! `toolgate-proxy`: an MCP (Streamable HTTP) server in front of an existing REST service.
//!
//! Request path of one `tools/call`: transport checks (Origin, body size, protocol version,
//! session) → tool lookup → argument validation against the compiled JSON Schema → mapping
//! to an HTTP request → upstream call with a per-tool timeout → shaping of the response into
//! the result envelope.

#![forbid(unsafe_code)]

pub mod admin;
pub mod audit;
pub mod envelope;
pub mod import;
pub mod mcp;
pub mod metrics;
pub mod otel;
pub mod policy;
pub mod reload;
pub mod runtime;
pub mod server;
pub mod store;
pub mod trace;
pub mod upstream;

pub use runtime::{CompileError, Runtime};
pub use server::{start, Running, StartError, StartOptions};
pub use toolgate_config as config;
