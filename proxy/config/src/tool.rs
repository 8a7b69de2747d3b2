//! One tool of the config: its schemas, the HTTP request it becomes, how the response is
//! shaped into the envelope, and its tier and safety class.

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// One MCP tool backed by one HTTP request.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ToolConfig {
    /// MCP tool name: 1-128 characters of `A-Z a-z 0-9 _ - .`.
    pub name: String,
    /// Human-readable title.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub title: Option<String>,
    /// What the tool does.
    #[serde(default)]
    pub description: String,
    /// The semantic contract published after the description.
    #[serde(flatten)]
    pub contract: SemanticContract,
    /// JSON Schema of `arguments`; the root must be `type: object`.
    #[schemars(schema_with = "any_object_schema")]
    pub input_schema: Value,
    /// JSON Schema of the envelope's `data` on success.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "optional_any_object_schema")]
    pub output_schema: Option<Value>,
    /// MCP tool annotations; unset hints are derived from the HTTP method.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub annotations: Option<Annotations>,
    /// `read` or `write`; derived from the HTTP method when unset (GET/HEAD are read).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tier: Option<Tier>,
    /// Role a caller needs to call the tool (enforced by the policy layer). Unset: any caller
    /// for a read-tier tool, the second-lowest role for a write-tier one
    /// ([`PolicyConfig::required_role`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub required_role: Option<String>,
    /// Risk class reported in every envelope; derived from the HTTP method when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub safety: Option<Safety>,
    /// How arguments become an HTTP request.
    pub http: HttpMapping,
    /// How the HTTP response becomes the envelope.
    #[serde(default)]
    pub response: ResponseShaping,
}

/// The semantic contract of a tool: six optional sentences an agent reads after the
/// description, published in `tools/list` as labelled paragraphs. Shared by the ProxyConfig tool
/// and the McpTool spec, which both flatten it into their own fields.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SemanticContract {
    /// Semantic contract: when an agent should call the tool.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub when_to_use: Option<String>,
    /// Semantic contract: what the tool must never be used for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub never_use_for: Option<String>,
    /// Semantic contract: identity the caller must have established first.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub identity: Option<String>,
    /// Semantic contract: what changes in the world when the tool runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub side_effects: Option<String>,
    /// Semantic contract: what a successful result looks like.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub success_criteria: Option<String>,
    /// Semantic contract: what to do when the tool cannot help.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fallback: Option<String>,
}

/// MCP tool annotations (all optional).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Annotations {
    /// The tool does not modify its environment.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub read_only_hint: Option<bool>,
    /// The tool may perform destructive updates.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub destructive_hint: Option<bool>,
    /// Calling repeatedly with the same arguments has no additional effect.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idempotent_hint: Option<bool>,
    /// The tool interacts with an open world of external entities.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub open_world_hint: Option<bool>,
}

/// Read tools are served in read-only mode; write tools need it turned off.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Tier {
    /// Does not change upstream state.
    Read,
    /// Changes upstream state.
    Write,
}

/// The risk class of a tool, reported in every envelope.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Safety {
    /// Reads only.
    ReadOnly,
    /// Changes state inside the service.
    Mutation,
    /// Sends something outside (a message, a payment).
    ExternalSend,
    /// Deletes or irreversibly changes something.
    Destructive,
}

impl Safety {
    /// The wire name (`read_only`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            Safety::ReadOnly => "read_only",
            Safety::Mutation => "mutation",
            Safety::ExternalSend => "external_send",
            Safety::Destructive => "destructive",
        }
    }
}

impl Tier {
    /// The wire name (`read`, `write`).
    pub fn as_str(self) -> &'static str {
        match self {
            Tier::Read => "read",
            Tier::Write => "write",
        }
    }
}

/// HTTP methods a tool may use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "UPPERCASE")]
pub enum Method {
    /// GET (read, idempotent).
    Get,
    /// HEAD (read, idempotent).
    Head,
    /// POST (write).
    Post,
    /// PUT (write, idempotent).
    Put,
    /// PATCH (write).
    Patch,
    /// DELETE (write, idempotent, destructive).
    Delete,
}

impl Method {
    /// The method as sent on the wire.
    pub fn as_str(self) -> &'static str {
        match self {
            Method::Get => "GET",
            Method::Head => "HEAD",
            Method::Post => "POST",
            Method::Put => "PUT",
            Method::Patch => "PATCH",
            Method::Delete => "DELETE",
        }
    }

    /// GET and HEAD do not change state.
    pub fn is_read(self) -> bool {
        matches!(self, Method::Get | Method::Head)
    }

    /// Whether this method carries the JSON body by default.
    pub fn has_body_by_default(self) -> bool {
        matches!(self, Method::Post | Method::Put | Method::Patch)
    }
}

/// How a tool call becomes an HTTP request.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct HttpMapping {
    /// HTTP method.
    pub method: Method,
    /// Path template below the upstream base URL, e.g. `/customers/{customerId}`. Each
    /// placeholder names a declared argument and fills exactly one percent-encoded segment.
    pub path: String,
    /// Query parameters: name → template (`"{limit}"` or literal text). A parameter whose
    /// arguments are absent is left out; an array argument repeats the parameter.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub query: BTreeMap<String, String>,
    /// Request headers: name → template. CR and LF are refused, in config and in arguments.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub headers: BTreeMap<String, String>,
    /// JSON body: `all` (every argument not used by the path, query or headers), `none`, a
    /// list of argument names, or `{argument: NAME}` (that argument's value is the whole body).
    /// Default: `all` for POST/PUT/PATCH, `none` otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub body: Option<BodyMapping>,
    /// Per-call timeout; default `upstream.timeoutMs`, at most 29000.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<u64>,
}

/// Which arguments travel in the JSON body.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(untagged)]
pub enum BodyMapping {
    /// `all` or `none`.
    Mode(BodyMode),
    /// Exactly these arguments (absent ones are left out).
    Fields(Vec<String>),
    /// One argument's value is the whole body (an array, a `oneOf`, an object whose properties
    /// cannot be arguments of their own); absent, no body is sent.
    Argument(ArgumentBody),
}

/// `body: {argument: NAME}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ArgumentBody {
    /// The argument whose value is sent as the JSON body.
    pub argument: String,
}

/// `all` or `none`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum BodyMode {
    /// Every argument not consumed by the path, query or headers.
    All,
    /// No body.
    None,
}

/// How the upstream response becomes the envelope.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ResponseShaping {
    /// JSON pointers kept from a successful body (an allowlist). Empty keeps everything.
    /// A `*` segment matches every array element or object member.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pick: Vec<String>,
    /// JSON pointers kept from a 4xx body (an allowlist for error details and confirmation
    /// candidates). Empty keeps the whole (redacted) body.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub error_pick: Vec<String>,
    /// JSON pointers removed from the body (after `pick`), on success and on 4xx bodies.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub redact: Vec<String>,
    /// JSON pointers into `data` that must be present for a `success`; otherwise the call is
    /// `failed` with code `missing_evidence`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub evidence: Vec<String>,
    /// HTTP status (`"404"`) or class (`"4xx"`) → business outcome. Exact codes win over classes,
    /// both over the built-in defaults.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub statuses: BTreeMap<String, StatusMapping>,
}

/// The business outcome of one upstream HTTP status.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct StatusMapping {
    /// Business status reported in the envelope.
    pub status: BusinessStatus,
    /// Error code (default derived from the HTTP status).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub code: Option<String>,
    /// Message in English.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// Message in Spanish.
    #[serde(default, rename = "message_es", skip_serializing_if = "Option::is_none")]
    pub message_es: Option<String>,
    /// The question the agent should ask the user next.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_question: Option<String>,
    /// Whether retrying the same call may succeed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retryable: Option<bool>,
}

/// Business status of a tool result.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum BusinessStatus {
    /// The operation finished and its evidence is present.
    Success,
    /// The operation could not be completed.
    Failed,
    /// Data from the user is missing.
    NeedsMoreInfo,
    /// Candidates or an action need the user's confirmation.
    PendingConfirmation,
    /// The operation was accepted and is in progress.
    Queued,
}

impl BusinessStatus {
    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            BusinessStatus::Success => "success",
            BusinessStatus::Failed => "failed",
            BusinessStatus::NeedsMoreInfo => "needs_more_info",
            BusinessStatus::PendingConfirmation => "pending_confirmation",
            BusinessStatus::Queued => "queued",
        }
    }

    /// `ok` in the envelope: the operation succeeded or was accepted.
    pub fn is_ok(self) -> bool {
        matches!(self, BusinessStatus::Success | BusinessStatus::Queued)
    }
}

impl ToolConfig {
    /// The tier, derived from the HTTP method when not given.
    pub fn effective_tier(&self) -> Tier {
        self.tier.unwrap_or(if self.http.method.is_read() {
            Tier::Read
        } else {
            Tier::Write
        })
    }

    /// The safety class, derived from the HTTP method when not given.
    pub fn effective_safety(&self) -> Safety {
        self.safety.unwrap_or(match self.http.method {
            Method::Get | Method::Head => Safety::ReadOnly,
            Method::Delete => Safety::Destructive,
            Method::Post | Method::Put | Method::Patch => Safety::Mutation,
        })
    }

    /// Annotations with every unset hint derived from the HTTP method (and the tier).
    pub fn effective_annotations(&self) -> Annotations {
        let given = self.annotations.clone().unwrap_or_default();
        let m = self.http.method;
        let read = self.effective_tier() == Tier::Read;
        Annotations {
            read_only_hint: Some(given.read_only_hint.unwrap_or(read)),
            destructive_hint: Some(
                given
                    .destructive_hint
                    .unwrap_or(!read && (m == Method::Delete || self.safety == Some(Safety::Destructive))),
            ),
            idempotent_hint: Some(
                given
                    .idempotent_hint
                    .unwrap_or(matches!(m, Method::Get | Method::Head | Method::Put | Method::Delete)),
            ),
            open_world_hint: Some(
                given
                    .open_world_hint
                    .unwrap_or(self.effective_safety() == Safety::ExternalSend),
            ),
        }
    }

    /// Whether a server in read-only mode serves this tool: a read-tier, `read_only` tool over
    /// GET or HEAD, or over POST (a query that takes a body) when `allow_read_over_post`. PUT,
    /// PATCH and DELETE never are, whatever the tool declares.
    pub fn served_read_only(&self, allow_read_over_post: bool) -> bool {
        let safe_method = match self.http.method {
            Method::Get | Method::Head => true,
            Method::Post => allow_read_over_post,
            Method::Put | Method::Patch | Method::Delete => false,
        };
        safe_method && self.effective_tier() == Tier::Read && self.effective_safety() == Safety::ReadOnly
    }

    /// The body mapping, with the method's default applied.
    pub fn effective_body(&self) -> BodyMapping {
        self.http
            .body
            .clone()
            .unwrap_or(if self.http.method.has_body_by_default() {
                BodyMapping::Mode(BodyMode::All)
            } else {
                BodyMapping::Mode(BodyMode::None)
            })
    }

    /// The description published in `tools/list`: the description followed by the semantic
    /// contract, in a fixed order, each under its heading.
    pub fn published_description(&self) -> String {
        let mut out = self.description.trim().to_string();
        let sections = [
            ("When to use", &self.contract.when_to_use),
            ("Never use for", &self.contract.never_use_for),
            ("Identity", &self.contract.identity),
            ("Side effects", &self.contract.side_effects),
            ("Success criteria", &self.contract.success_criteria),
            ("Fallback", &self.contract.fallback),
        ];
        for (heading, text) in sections {
            if let Some(text) = text.as_deref().map(str::trim).filter(|t| !t.is_empty()) {
                if !out.is_empty() {
                    out.push_str("\n\n");
                }
                out.push_str(heading);
                out.push_str(":\n");
                out.push_str(text);
            }
        }
        out
    }
}

fn any_object_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "object",
        "description": "A JSON Schema (draft 2020-12 unless `$schema` says otherwise) whose root is `type: object`.",
        "additionalProperties": true
    })
}

fn optional_any_object_schema(g: &mut schemars::SchemaGenerator) -> schemars::Schema {
    any_object_schema(g)
}
