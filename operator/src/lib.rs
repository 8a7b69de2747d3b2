//! toolgate-operator: `McpServer` and `McpTool` reconciled into toolgate-proxy sidecars and
//! gateways.
#![forbid(unsafe_code)]

pub mod admin;
pub mod controller;
pub mod crd;
pub mod guard;
pub mod inject;
pub mod leader;
pub mod metrics;
pub mod objects;
pub mod render;
pub mod sessionkeys;
pub mod status;
pub mod testing;
