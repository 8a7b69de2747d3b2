use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::{CustomResource, KubeSchema};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use toolgate_config::{Annotations, BodyMode, Method, ResponseShaping, Safety, SemanticContract, Tier};

use super::{conditions_schema, free_object_schema, optional_free_object_schema, HasConditions};

/// One MCP tool backed by one HTTP request to the server's upstream. Every field but
/// `serverRef` is a tool field of ProxyConfig (see docs/proxy-config.md).
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "toolgate.dev",
    version = "v1alpha1",
    kind = "McpTool",
    namespaced,
    status = "McpToolStatus",
    shortname = "mcptool",
    category = "toolgate",
    printcolumn = r#"{"name":"Server","type":"string","jsonPath":".spec.serverRef.name"}"#,
    printcolumn = r#"{"name":"Tier","type":"string","jsonPath":".status.tier"}"#,
    printcolumn = r#"{"name":"Accepted","type":"string","jsonPath":".status.conditions[?(@.type==\"Accepted\")].status"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct McpToolSpec {
    /// The McpServer (same namespace) that serves this tool.
    pub server_ref: ServerRef,
    /// MCP tool name (1-128 of `A-Z a-z 0-9 _ - .`); defaults to `metadata.name`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = kube::core::Rule::new("self.matches('^[A-Za-z0-9_.-]{1,128}$')").message("must be 1-128 characters of A-Z a-z 0-9 _ - ."))]
    pub name: Option<String>,
    /// Human-readable title.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub title: Option<String>,
    /// What the tool does.
    pub description: String,
    /// The semantic contract published after the description.
    #[serde(flatten)]
    pub contract: SemanticContract,
    /// JSON Schema of `arguments` (free-form); the root must be `type: object`.
    #[schemars(schema_with = "free_object_schema")]
    #[x_kube(validation = kube::core::Rule::new("has(self.type) && self.type == 'object'").message("inputSchema must have type: object at its root"))]
    pub input_schema: Value,
    /// JSON Schema of the envelope's `data` on success (free-form).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "optional_free_object_schema")]
    pub output_schema: Option<Value>,
    /// MCP tool annotations; unset hints are derived from the HTTP method.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub annotations: Option<Annotations>,
    /// `read` or `write`; derived from the HTTP method when unset (GET/HEAD are read).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tier: Option<Tier>,
    /// Role a caller needs (one of the server's roles). Unset: anyone for a read tool, the
    /// second-lowest role (`operator` by default) for a write tool; the lowest role opens a write
    /// tool to every caller.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub required_role: Option<String>,
    /// Risk class reported in every envelope; derived from the HTTP method when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub safety: Option<Safety>,
    /// How arguments become an HTTP request.
    pub http: ToolHttp,
    /// How the HTTP response becomes the envelope.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub response: Option<ResponseShaping>,
}

/// Names an McpServer in the tool's namespace.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct ServerRef {
    /// Name of the McpServer.
    #[x_kube(validation = kube::core::Rule::new("self != ''").message("serverRef.name must not be empty"))]
    pub name: String,
}

/// How arguments become an HTTP request (ProxyConfig `http`).
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ToolHttp {
    /// HTTP method.
    pub method: Method,
    /// Path template, for example `/customers/{id}`; each placeholder is one encoded segment.
    #[x_kube(validation = kube::core::Rule::new("self.startsWith('/')").message("http.path must start with /"))]
    pub path: String,
    /// Query parameters: name to template.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub query: BTreeMap<String, String>,
    /// Request headers: name to template.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub headers: BTreeMap<String, String>,
    /// Which arguments travel in the JSON body; default: all for POST/PUT/PATCH, none otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub body: Option<ToolBody>,
    /// Per-call timeout in milliseconds (at most 29000).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<u64>,
}

/// The JSON body: `mode: all|none`, exactly `fields`, or one `argument` as the whole body.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[x_kube(validation = kube::core::Rule::new("[has(self.mode), has(self.fields), has(self.argument)].filter(x, x).size() == 1").message("set exactly one of body.mode, body.fields and body.argument"))]
pub struct ToolBody {
    /// `all`: every argument not used by the path, query or headers; `none`: no body.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<BodyMode>,
    /// Exactly these arguments (absent ones are left out).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fields: Option<Vec<String>>,
    /// This argument's value is the whole body (absent: no body).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub argument: Option<String>,
}

/// Observed state of an McpTool, written by the operator.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct McpToolStatus {
    /// `Accepted`: True when the tool is in its server's config; False says why not.
    #[serde(default)]
    #[schemars(schema_with = "conditions_schema")]
    pub conditions: Vec<Condition>,
    /// The generation the conditions describe.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Effective tier (`read` or `write`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tier: Option<Tier>,
}

impl HasConditions for McpToolStatus {
    fn conditions(&self) -> &[Condition] {
        &self.conditions
    }
}

impl McpTool {
    /// The MCP name this tool is served under.
    pub fn tool_name(&self) -> &str {
        self.spec
            .name
            .as_deref()
            .or(self.metadata.name.as_deref())
            .unwrap_or_default()
    }
}
