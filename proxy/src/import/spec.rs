//! Reading an OpenAPI document into the operations the generator needs. The structure (paths,
//! operations, parameters, bodies, responses and the `$ref`s between them) is read by a
//! maintained crate per version, because 3.0 and 3.1 differ exactly where a single model would
//! have to guess: `openapiv3` models 3.0.x (`nullable`, boolean `exclusiveMinimum`) and `oas3`
//! models 3.1.x (JSON Schema 2020-12: type arrays, `const`, boolean schemas). Schemas become
//! JSON values (their serde form), which [`super::schema`] turns into one JSON Schema dialect.

use serde_json::{Map, Value};

/// The OpenAPI major.minor a document declares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Version {
    /// 3.0.x: schemas are OpenAPI's extended subset of JSON Schema draft 4/5.
    V30,
    /// 3.1.x: schemas are JSON Schema 2020-12.
    V31,
}

/// Where a parameter travels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Location {
    /// A path segment.
    Path,
    /// A query parameter.
    Query,
    /// A request header.
    Header,
    /// A cookie (never imported: the proxy does not send client-chosen cookies).
    Cookie,
}

/// One parameter, its `$ref` resolved.
#[derive(Debug, Clone)]
pub struct Param {
    /// Name as sent.
    pub name: String,
    /// Where it goes.
    pub location: Location,
    /// Whether the operation requires it (path parameters always are).
    pub required: bool,
    /// Its description.
    pub description: Option<String>,
    /// Its schema (`None` when it is given as `content` instead).
    pub schema: Option<Value>,
    /// `style` other than the location's default, or `explode: false` on a query array: forms
    /// the proxy does not build.
    pub unusual_style: Option<String>,
}

/// The request body, its `$ref` resolved.
#[derive(Debug, Clone)]
pub struct Body {
    /// Whether the body is required.
    pub required: bool,
    /// Its description.
    pub description: Option<String>,
    /// Media type → schema, in document order.
    pub content: Vec<(String, Option<Value>)>,
}

/// One operation of the document.
#[derive(Debug, Clone)]
pub struct Operation {
    /// Lowercase HTTP method.
    pub method: String,
    /// Path template as written in `paths`.
    pub path: String,
    /// `operationId`.
    pub operation_id: Option<String>,
    /// `summary`.
    pub summary: Option<String>,
    /// `description`.
    pub description: Option<String>,
    /// `tags`.
    pub tags: Vec<String>,
    /// `deprecated`.
    pub deprecated: bool,
    /// Path-item and operation parameters merged (the operation's win, as the spec says).
    pub params: Vec<Param>,
    /// The request body.
    pub body: Option<Body>,
    /// The schema of the first 2xx response with a JSON body.
    pub response_schema: Option<Value>,
    /// Why the operation cannot be read (a `$ref` to another file, a missing component).
    pub problem: Option<String>,
}

/// A read document.
#[derive(Debug, Clone)]
pub struct Spec {
    /// Its version.
    pub version: Version,
    /// `info.title`.
    pub title: String,
    /// `info.version`.
    pub api_version: String,
    /// The first `servers[].url`, if any.
    pub server_url: Option<String>,
    /// `components.schemas`, by name.
    pub schemas: Map<String, Value>,
    /// Every operation, in document order.
    pub operations: Vec<Operation>,
}

fn json<T: serde::Serialize>(v: &T) -> Value {
    serde_json::to_value(v).unwrap_or(Value::Null)
}

/// The component name of a local reference such as `#/components/parameters/limit`.
fn component<'a>(reference: &'a str, kind: &str) -> Result<&'a str, String> {
    reference
        .strip_prefix("#/components/")
        .and_then(|r| r.strip_prefix(kind))
        .and_then(|r| r.strip_prefix('/'))
        .ok_or_else(|| format!("`$ref: {reference}` points outside this document's components.{kind} (only local references are resolved)"))
}

/// Merges path-item and operation parameters: an operation parameter replaces the path item's
/// of the same name and location.
fn merge(mut common: Vec<Param>, own: Vec<Param>) -> Vec<Param> {
    for p in own {
        common.retain(|c| !(c.name == p.name && c.location == p.location));
        common.push(p);
    }
    common
}

fn unusual_style(
    location: Location,
    style: Option<&str>,
    explode: Option<bool>,
    schema: Option<&Value>,
) -> Option<String> {
    let default = match location {
        Location::Path | Location::Header => "simple",
        Location::Query | Location::Cookie => "form",
    };
    if let Some(s) = style.filter(|s| *s != default) {
        return Some(format!("style `{s}`"));
    }
    let is_array = schema.and_then(|s| s.get("type")).is_some_and(|t| t == "array");
    if location == Location::Query && explode == Some(false) && is_array {
        return Some("`explode: false` (comma-joined arrays)".into());
    }
    None
}

/// Reads `doc` (an OpenAPI 3.0.x or 3.1.x document as JSON).
pub fn read(doc: Value) -> Result<Spec, String> {
    let declared = doc.get("openapi").and_then(Value::as_str).map(str::to_string);
    match declared.as_deref() {
        Some(v) if v.starts_with("3.0.") || v == "3.0" => v30::read(doc),
        Some(v) if v.starts_with("3.1.") || v == "3.1" => v31::read(doc),
        Some(v) => Err(format!(
            "OpenAPI {v} is not supported: import reads 3.0.x and 3.1.x documents"
        )),
        None if doc.get("swagger").is_some() => Err(
            "this is a Swagger 2.0 document: convert it to OpenAPI 3 first (for example with swagger2openapi)".into(),
        ),
        None => Err("not an OpenAPI document: there is no top-level `openapi` version".into()),
    }
}

fn sorted_schemas<T: serde::Serialize>(schemas: impl IntoIterator<Item = (String, T)>) -> Map<String, Value> {
    schemas.into_iter().map(|(k, v)| (k, json(&v))).collect()
}

mod v30 {
    use openapiv3::{OpenAPI, Parameter, ParameterSchemaOrContent, ReferenceOr, RequestBody, Response, StatusCode};

    use super::*;

    fn param(p: &Parameter) -> Param {
        let (data, location, style, explode) = match p {
            Parameter::Query {
                parameter_data, style, ..
            } => {
                let s = json(style);
                (
                    parameter_data,
                    Location::Query,
                    s.as_str().map(str::to_string),
                    parameter_data.explode,
                )
            }
            Parameter::Header { parameter_data, style } => (
                parameter_data,
                Location::Header,
                json(style).as_str().map(str::to_string),
                parameter_data.explode,
            ),
            Parameter::Path { parameter_data, style } => (
                parameter_data,
                Location::Path,
                json(style).as_str().map(str::to_string),
                parameter_data.explode,
            ),
            Parameter::Cookie { parameter_data, style } => (
                parameter_data,
                Location::Cookie,
                json(style).as_str().map(str::to_string),
                parameter_data.explode,
            ),
        };
        let schema = match &data.format {
            ParameterSchemaOrContent::Schema(s) => Some(json(s)),
            ParameterSchemaOrContent::Content(_) => None,
        };
        Param {
            name: data.name.clone(),
            location,
            required: data.required || location == Location::Path,
            description: data.description.clone(),
            unusual_style: unusual_style(location, style.as_deref(), explode, schema.as_ref()),
            schema,
        }
    }

    fn params(spec: &OpenAPI, list: &[ReferenceOr<Parameter>]) -> Result<Vec<Param>, String> {
        list.iter()
            .map(|p| match p {
                ReferenceOr::Item(p) => Ok(param(p)),
                ReferenceOr::Reference { reference } => {
                    let name = component(reference, "parameters")?;
                    match spec.components.as_ref().and_then(|c| c.parameters.get(name)) {
                        Some(ReferenceOr::Item(p)) => Ok(param(p)),
                        _ => Err(format!(
                            "`$ref: {reference}` names no parameter in components.parameters"
                        )),
                    }
                }
            })
            .collect()
    }

    fn body(spec: &OpenAPI, b: &ReferenceOr<RequestBody>) -> Result<Body, String> {
        let b = match b {
            ReferenceOr::Item(b) => b,
            ReferenceOr::Reference { reference } => {
                let name = component(reference, "requestBodies")?;
                match spec.components.as_ref().and_then(|c| c.request_bodies.get(name)) {
                    Some(ReferenceOr::Item(b)) => b,
                    _ => {
                        return Err(format!(
                            "`$ref: {reference}` names no request body in components.requestBodies"
                        ))
                    }
                }
            }
        };
        Ok(Body {
            required: b.required,
            description: b.description.clone(),
            content: b
                .content
                .iter()
                .map(|(t, m)| (t.clone(), m.schema.as_ref().map(json)))
                .collect(),
        })
    }

    fn response_schema(spec: &OpenAPI, op: &openapiv3::Operation) -> Option<Value> {
        let mut codes: Vec<(u16, &ReferenceOr<Response>)> = op
            .responses
            .responses
            .iter()
            .filter_map(|(code, r)| match code {
                StatusCode::Code(c) if (200..300).contains(c) => Some((*c, r)),
                StatusCode::Range(2) => Some((299, r)),
                _ => None,
            })
            .collect();
        codes.sort_by_key(|(c, _)| *c);
        codes.into_iter().find_map(|(_, r)| {
            let r = match r {
                ReferenceOr::Item(r) => r,
                ReferenceOr::Reference { reference } => {
                    let name = component(reference, "responses").ok()?;
                    match spec.components.as_ref()?.responses.get(name)? {
                        ReferenceOr::Item(r) => r,
                        ReferenceOr::Reference { .. } => return None,
                    }
                }
            };
            r.content
                .iter()
                .find(|(t, _)| super::super::tools::is_json(t))
                .and_then(|(_, m)| m.schema.as_ref().map(json))
        })
    }

    pub(super) fn read(doc: Value) -> Result<Spec, String> {
        let spec: OpenAPI =
            serde_json::from_value(doc).map_err(|e| format!("not a valid OpenAPI 3.0 document: {e}"))?;
        let mut operations = Vec::new();
        for (path, item) in &spec.paths.paths {
            let item = match item {
                ReferenceOr::Item(i) => i,
                ReferenceOr::Reference { reference } => {
                    operations.push(Operation {
                        problem: Some(format!(
                            "the path item is a `$ref: {reference}`, which import does not follow"
                        )),
                        ..blank("get", path)
                    });
                    continue;
                }
            };
            let common = params(&spec, &item.parameters);
            for (method, op) in item.iter() {
                let mut out = Operation {
                    operation_id: op.operation_id.clone(),
                    summary: op.summary.clone().or_else(|| item.summary.clone()),
                    description: op.description.clone().or_else(|| item.description.clone()),
                    tags: op.tags.clone(),
                    deprecated: op.deprecated,
                    response_schema: response_schema(&spec, op),
                    ..blank(method, path)
                };
                let read = || -> Result<(Vec<Param>, Option<Body>), String> {
                    let own = params(&spec, &op.parameters)?;
                    let body = op.request_body.as_ref().map(|b| body(&spec, b)).transpose()?;
                    Ok((merge(common.clone()?, own), body))
                };
                match read() {
                    Ok((p, b)) => {
                        out.params = p;
                        out.body = b;
                    }
                    Err(e) => out.problem = Some(e),
                }
                operations.push(out);
            }
        }
        let schemas = spec
            .components
            .as_ref()
            .map(|c| sorted_schemas(c.schemas.clone()))
            .unwrap_or_default();
        Ok(Spec {
            version: Version::V30,
            title: spec.info.title.clone(),
            api_version: spec.info.version.clone(),
            server_url: spec.servers.first().map(|s| s.url.clone()),
            schemas,
            operations,
        })
    }
}

fn blank(method: &str, path: &str) -> Operation {
    Operation {
        method: method.to_ascii_lowercase(),
        path: path.to_string(),
        operation_id: None,
        summary: None,
        description: None,
        tags: Vec::new(),
        deprecated: false,
        params: Vec::new(),
        body: None,
        response_schema: None,
        problem: None,
    }
}

/// `token` escaped for a JSON pointer.
fn esc(token: &str) -> String {
    token.replace('~', "~0").replace('/', "~1")
}

mod v31 {
    //! oas3 reads the structure; every schema is taken from the document itself at the place
    //! oas3 found it, because oas3's schema model keeps only part of JSON Schema 2020-12 (no
    //! `not`, `if`, `patternProperties`, `dependentRequired`, `$defs`, siblings of `$ref`...),
    //! and a tool must validate what the spec says, not less.
    use oas3::spec::{ObjectOrReference, Parameter, ParameterIn};
    use oas3::Spec as Oas;

    use super::*;

    struct Doc<'a> {
        spec: &'a Oas,
        raw: &'a Value,
    }

    impl Doc<'_> {
        fn schema_at(&self, pointer: &str) -> Option<Value> {
            self.raw.pointer(&format!("{pointer}/schema")).cloned()
        }
    }

    fn param(doc: &Doc<'_>, p: &Parameter, pointer: &str) -> Param {
        let location = match p.location {
            ParameterIn::Path => Location::Path,
            ParameterIn::Query => Location::Query,
            ParameterIn::Header => Location::Header,
            ParameterIn::Cookie => Location::Cookie,
        };
        let schema = p.schema.as_ref().and_then(|_| doc.schema_at(pointer));
        let style = p.style.as_ref().map(json);
        Param {
            name: p.name.clone(),
            location,
            required: p.required.unwrap_or(false) || location == Location::Path,
            description: p.description.clone(),
            unusual_style: unusual_style(
                location,
                style.as_ref().and_then(Value::as_str),
                p.explode,
                schema.as_ref(),
            ),
            schema,
        }
    }

    /// The object and where it is in the document (`here`, or its component).
    fn resolve<'a, T>(
        item: &'a ObjectOrReference<T>,
        here: String,
        kind: &str,
        lookup: impl Fn(&str) -> Option<&'a ObjectOrReference<T>>,
    ) -> Result<(&'a T, String), String> {
        match item {
            ObjectOrReference::Object(o) => Ok((o, here)),
            ObjectOrReference::Ref { ref_path, .. } => {
                let name = component(ref_path, kind)?;
                match lookup(name) {
                    Some(ObjectOrReference::Object(o)) => Ok((o, format!("/components/{kind}/{}", esc(name)))),
                    _ => Err(format!("`$ref: {ref_path}` names nothing in components.{kind}")),
                }
            }
        }
    }

    fn params(doc: &Doc<'_>, list: &[ObjectOrReference<Parameter>], base: &str) -> Result<Vec<Param>, String> {
        list.iter()
            .enumerate()
            .map(|(i, p)| {
                let (p, at) = resolve(p, format!("{base}/{i}"), "parameters", |n| {
                    doc.spec.components.as_ref()?.parameters.get(n)
                })?;
                Ok(param(doc, p, &at))
            })
            .collect()
    }

    fn body(doc: &Doc<'_>, op: &oas3::spec::Operation, at: &str) -> Result<Option<Body>, String> {
        let Some(b) = &op.request_body else { return Ok(None) };
        let (b, at) = resolve(b, format!("{at}/requestBody"), "requestBodies", |n| {
            doc.spec.components.as_ref()?.request_bodies.get(n)
        })?;
        Ok(Some(Body {
            required: b.required.unwrap_or(false),
            description: b.description.clone(),
            content: b
                .content
                .keys()
                .map(|t| (t.clone(), doc.schema_at(&format!("{at}/content/{}", esc(t)))))
                .collect(),
        }))
    }

    fn response_schema(doc: &Doc<'_>, op: &oas3::spec::Operation, at: &str) -> Option<Value> {
        let mut codes: Vec<(u16, &String, _)> = op
            .responses
            .as_ref()?
            .iter()
            .filter_map(|(code, r)| match code.parse::<u16>() {
                Ok(c) if (200..300).contains(&c) => Some((c, code, r)),
                _ if code.eq_ignore_ascii_case("2XX") => Some((299, code, r)),
                _ => None,
            })
            .collect();
        codes.sort_by_key(|(c, _, _)| *c);
        codes.into_iter().find_map(|(_, code, r)| {
            let (r, at) = resolve(r, format!("{at}/responses/{}", esc(code)), "responses", |n| {
                doc.spec.components.as_ref()?.responses.get(n)
            })
            .ok()?;
            let (t, _) = r.content.iter().find(|(t, _)| super::super::tools::is_json(t))?;
            doc.schema_at(&format!("{at}/content/{}", esc(t)))
        })
    }

    pub(super) fn read(raw: Value) -> Result<Spec, String> {
        let spec: Oas =
            serde_json::from_value(raw.clone()).map_err(|e| format!("not a valid OpenAPI 3.1 document: {e}"))?;
        let doc = Doc { spec: &spec, raw: &raw };
        let mut operations = Vec::new();
        for (path, item) in spec.paths.iter().flatten() {
            if let Some(reference) = &item.reference {
                operations.push(Operation {
                    problem: Some(format!(
                        "the path item is a `$ref: {reference}`, which import does not follow"
                    )),
                    ..blank("get", path)
                });
                continue;
            }
            let item_at = format!("/paths/{}", esc(path));
            let common = params(&doc, &item.parameters, &format!("{item_at}/parameters"));
            for (method, op) in item.methods() {
                let method = method.as_str().to_ascii_lowercase();
                let at = format!("{item_at}/{method}");
                let mut out = Operation {
                    operation_id: op.operation_id.clone(),
                    summary: op.summary.clone().or_else(|| item.summary.clone()),
                    description: op.description.clone().or_else(|| item.description.clone()),
                    tags: op.tags.clone(),
                    deprecated: op.deprecated.unwrap_or(false),
                    response_schema: response_schema(&doc, op, &at),
                    ..blank(&method, path)
                };
                let read = || -> Result<(Vec<Param>, Option<Body>), String> {
                    let own = params(&doc, &op.parameters, &format!("{at}/parameters"))?;
                    Ok((merge(common.clone()?, own), body(&doc, op, &at)?))
                };
                match read() {
                    Ok((p, b)) => {
                        out.params = p;
                        out.body = b;
                    }
                    Err(e) => out.problem = Some(e),
                }
                operations.push(out);
            }
        }
        let schemas = raw
            .pointer("/components/schemas")
            .and_then(Value::as_object)
            .cloned()
            .unwrap_or_default();
        Ok(Spec {
            version: Version::V31,
            title: spec.info.title.clone(),
            api_version: spec.info.version.clone(),
            server_url: spec.servers.first().map(|s| s.url.clone()),
            schemas,
            operations,
        })
    }
}
