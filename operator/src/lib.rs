//! toolgate-operator: `McpServer` and `McpTool` reconciled into toolgate-proxy sidecars and
//! gateways.
#![forbid(unsafe_code)]

pub mod crd;
pub mod render;
pub mod status;
pub mod testing;
