//! The custom resources, kinds only: `McpServer` and `McpTool` (`toolgate.dev/v1alpha1`).

mod server;
mod tool;

pub use server::*;
pub use tool::*;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use schemars::json_schema;

/// API group of both kinds.
pub const GROUP: &str = "toolgate.dev";

/// `status.conditions` is a list keyed by `type`, so server-side apply merges it per condition.
pub(crate) fn conditions_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    json_schema!({
        "type": "array",
        "x-kubernetes-list-type": "map",
        "x-kubernetes-list-map-keys": ["type"],
        "items": {
            "type": "object",
            "required": ["type", "status", "lastTransitionTime", "reason", "message"],
            "properties": {
                "type": {"type": "string"},
                "status": {"type": "string", "enum": ["True", "False", "Unknown"]},
                "reason": {"type": "string"},
                "message": {"type": "string"},
                "observedGeneration": {"type": "integer", "format": "int64"},
                "lastTransitionTime": {"type": "string", "format": "date-time"}
            }
        }
    })
}

/// A free-form JSON object kept as written (JSON Schemas inside a tool).
pub(crate) fn free_object_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    json_schema!({
        "type": "object",
        "x-kubernetes-preserve-unknown-fields": true,
        "properties": { "type": { "type": "string" } }
    })
}

/// Same as [`free_object_schema`], optional.
pub(crate) fn optional_free_object_schema(g: &mut schemars::SchemaGenerator) -> schemars::Schema {
    let mut s = free_object_schema(g);
    s.insert("nullable".into(), true.into());
    s
}

/// Conditions kept by the operator, with helpers to read them.
pub trait HasConditions {
    /// The current conditions.
    fn conditions(&self) -> &[Condition];

    /// The condition of this type, if any.
    fn condition(&self, type_: &str) -> Option<&Condition> {
        self.conditions().iter().find(|c| c.type_ == type_)
    }
}
