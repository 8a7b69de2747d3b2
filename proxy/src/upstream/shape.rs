//! HTTP response → business outcome: status mapping, data allowlist (`pick`), redaction,
//! output contract and required evidence. Upstream internals (5xx bodies, transport errors)
//! never reach the agent.

use serde_json::{Map, Value};
use toolgate_config::pointer::Pointer;
use toolgate_config::{BusinessStatus, StatusMapping};

use super::pick::Pick;
use crate::envelope::{ErrorEntry, Outcome};
use crate::runtime::CompiledTool;
use crate::upstream::{CallError, UpstreamResponse};

/// The built-in outcome of an HTTP status before configured overrides.
struct Default {
    status: BusinessStatus,
    code: &'static str,
    message: &'static str,
    message_es: &'static str,
    retryable: bool,
    next_question: Option<&'static str>,
}

// Specific statuses first, then their class: the overlap is the point.
#[allow(clippy::match_overlapping_arm)]
fn default_for(code: u16) -> Default {
    let d = |status, code, message, message_es, retryable| Default {
        status,
        code,
        message,
        message_es,
        retryable,
        next_question: None,
    };
    match code {
        202 => d(
            BusinessStatus::Queued,
            "queued",
            "The request was accepted and is being processed",
            "La solicitud fue aceptada y está en proceso",
            false,
        ),
        200..=299 => d(BusinessStatus::Success, "ok", "", "", false),
        404 => Default {
            next_question: Some("Could you confirm the identifying details (for example the id) so I can look again?"),
            ..d(
                BusinessStatus::NeedsMoreInfo,
                "not_found",
                "The service found no record for these arguments",
                "El servicio no encontró un registro con esos datos",
                false,
            )
        },
        409 => d(
            BusinessStatus::PendingConfirmation,
            "needs_confirmation",
            "The service needs a confirmation before it can go on",
            "El servicio necesita una confirmación para continuar",
            false,
        ),
        400 => d(
            BusinessStatus::Failed,
            "upstream_bad_request",
            "The service rejected the request as invalid",
            "El servicio rechazó la solicitud por inválida",
            false,
        ),
        401 | 403 => d(
            BusinessStatus::Failed,
            "upstream_forbidden",
            "The service refused the proxy's credentials for this operation",
            "El servicio no autorizó esta operación",
            false,
        ),
        408 => d(
            BusinessStatus::Failed,
            "upstream_timeout",
            "The service timed out",
            "El servicio tardó demasiado en responder",
            true,
        ),
        422 => d(
            BusinessStatus::Failed,
            "upstream_validation_failed",
            "The service could not process these values",
            "El servicio no pudo procesar esos valores",
            false,
        ),
        429 => d(
            BusinessStatus::Failed,
            "upstream_rate_limited",
            "The service is rate limiting requests; try again later",
            "El servicio está limitando solicitudes; intenta más tarde",
            true,
        ),
        400..=499 => d(
            BusinessStatus::Failed,
            "upstream_rejected",
            "The service rejected the request",
            "El servicio rechazó la solicitud",
            false,
        ),
        503 => d(
            BusinessStatus::Failed,
            "upstream_unavailable",
            "The service is temporarily unavailable",
            "El servicio no está disponible por ahora",
            true,
        ),
        500..=599 => d(
            BusinessStatus::Failed,
            "upstream_error",
            "The service failed while handling the request",
            "El servicio falló al procesar la solicitud",
            true,
        ),
        _ => d(
            BusinessStatus::Failed,
            "upstream_unexpected_status",
            "The service answered with an unexpected status",
            "El servicio respondió con un estado inesperado",
            false,
        ),
    }
}

fn mapping_for(tool: &CompiledTool, code: u16) -> Option<&StatusMapping> {
    tool.statuses
        .get(&code)
        .or_else(|| tool.classes.get(usize::from(code / 100)).and_then(Option::as_ref))
}

/// Outcome of a call that produced no response.
pub fn call_error(err: &CallError) -> Outcome {
    let e = match err {
        CallError::Timeout(d) => ErrorEntry::new(
            "upstream_timeout",
            format!("The service did not answer within {} ms", d.as_millis()),
            format!("El servicio no respondió en {} ms", d.as_millis()),
            true,
        ),
        CallError::Connect => ErrorEntry::new(
            "upstream_unavailable",
            "The service could not be reached",
            "No se pudo contactar al servicio",
            true,
        ),
        CallError::Transport => ErrorEntry::new(
            "upstream_unavailable",
            "The connection to the service broke",
            "Se interrumpió la conexión con el servicio",
            true,
        ),
        CallError::TooLarge(n) => ErrorEntry::new(
            "upstream_response_too_large",
            format!("The service's response exceeded {n} bytes"),
            format!("La respuesta del servicio superó {n} bytes"),
            false,
        ),
    };
    Outcome::failed(e)
}

fn is_json(resp: &UpstreamResponse) -> bool {
    resp.content_type
        .as_ref()
        .and_then(|v| v.to_str().ok())
        .map(|ct| {
            let ct = ct.split(';').next().unwrap_or("").trim().to_ascii_lowercase();
            ct == "application/json" || ct.ends_with("+json")
        })
        .unwrap_or(true)
}

/// The data of a response body with `allow` applied. A pick tree reads the members it keeps
/// straight from the body ([`super::pick::read`]); a body that is not an object, not JSON or
/// empty takes the general path, which says which.
fn picked_body(resp: &UpstreamResponse, allow: &Pick) -> Result<Value, ()> {
    if let Pick::Tree(members) = allow {
        if is_json(resp) {
            if let Some(v) = super::pick::read(&resp.body, members) {
                return Ok(v);
            }
        }
    }
    let body = parse_body(resp)?;
    Ok(match allow {
        Pick::All => body,
        Pick::Tree(members) => super::pick::pick_value(&body, members),
        Pick::Pointers(pointers) => pick(&body, pointers),
    })
}

fn parse_body(resp: &UpstreamResponse) -> Result<Value, ()> {
    if resp.body.iter().all(u8::is_ascii_whitespace) {
        return Ok(Value::Object(Map::new()));
    }
    if !is_json(resp) {
        return Err(());
    }
    let v: Value = serde_json::from_slice(&resp.body).map_err(|_| ())?;
    Ok(match v {
        Value::Object(_) => v,
        Value::Array(_) => Value::Object(Map::from_iter([("items".to_string(), v)])),
        other => Value::Object(Map::from_iter([("value".to_string(), other)])),
    })
}

/// Outcome of a complete upstream response.
pub fn response(tool: &CompiledTool, resp: &UpstreamResponse) -> Outcome {
    let code = resp.status;
    let d = default_for(code);
    let m = mapping_for(tool, code);
    let status = m.map_or(d.status, |m| m.status);
    let next_question = m
        .and_then(|m| m.next_question.clone())
        .or_else(|| d.next_question.map(str::to_string));
    let mut outcome = Outcome {
        status,
        data: None,
        errors: Vec::new(),
        next_question,
        upstream_status: Some(code),
    };
    let ok_status = matches!(status, BusinessStatus::Success | BusinessStatus::Queued);

    if ok_status {
        let Ok(mut data) = picked_body(resp, &tool.pick) else {
            outcome.status = BusinessStatus::Failed;
            outcome.next_question = None;
            outcome.errors.push(ErrorEntry::new(
                "upstream_invalid_response",
                "The service answered with a body that is not JSON",
                "El servicio respondió con un contenido que no es JSON",
                false,
            ));
            return outcome;
        };
        for p in &tool.redact {
            redact(&mut data, &p.tokens);
        }
        if status == BusinessStatus::Success {
            if let Some(output) = &tool.output {
                let violation = match output.get() {
                    Ok(v) => v
                        .iter_errors(&data)
                        .next()
                        .map(|e| e.instance_path().as_str().to_string()),
                    Err(e) => {
                        // It compiled at load; an answer that cannot be checked is not a success.
                        tracing::error!(
                            error = e,
                            "an outputSchema that compiled at load did not compile on first use"
                        );
                        Some(String::new())
                    }
                };
                if let Some(at) = violation {
                    outcome.status = BusinessStatus::Failed;
                    outcome.next_question = None;
                    outcome.errors.push(
                        ErrorEntry::new(
                            "upstream_contract_violation",
                            format!(
                                "The service's answer does not match the tool's declared output (at `{}`)",
                                if at.is_empty() { "/" } else { &at }
                            ),
                            "La respuesta del servicio no coincide con el formato declarado de la herramienta",
                            false,
                        )
                        .with_field(at),
                    );
                    return outcome;
                }
            }
            let missing: Vec<&str> = tool
                .evidence
                .iter()
                .filter(|(_, p)| !present(&data, &p.tokens))
                .map(|(t, _)| t.as_str())
                .collect();
            if !missing.is_empty() {
                outcome.status = BusinessStatus::Failed;
                outcome.next_question = None;
                for field in missing {
                    outcome.errors.push(
                        ErrorEntry::new(
                            "missing_evidence",
                            format!("The service reported success but `{field}` is missing, so the action cannot be verified"),
                            format!("El servicio indicó éxito pero falta `{field}`, así que la acción no se puede verificar"),
                            false,
                        )
                        .with_field(field),
                    );
                }
                outcome.data = Some(data);
                return outcome;
            }
        }
        outcome.data = Some(data);
        return outcome;
    }

    // Not ok: explain, and keep a (redacted) 4xx JSON body as data: it carries candidates for a
    // confirmation or the service's own validation details. A 2xx the tool maps to a non-ok
    // status keeps its (picked, redacted) body too. 5xx bodies are internals: dropped.
    let success_class = (200..300).contains(&code);
    if success_class || (400..500).contains(&code) {
        let allow = if success_class { &tool.pick } else { &tool.error_pick };
        if let Ok(mut body) = picked_body(resp, allow) {
            if body.as_object().is_some_and(|o| !o.is_empty()) {
                for p in &tool.redact {
                    redact(&mut body, &p.tokens);
                }
                outcome.data = Some(body);
            }
        }
    }
    let (default_code, default_message, default_message_es) = if success_class {
        (
            status.as_str().to_string(),
            format!(
                "The service answered HTTP {code}; this tool reports that as {}",
                status.as_str()
            ),
            format!(
                "El servicio respondió HTTP {code}; esta herramienta lo reporta como {}",
                status.as_str()
            ),
        )
    } else {
        (
            d.code.to_string(),
            format!("{} (HTTP {code})", d.message),
            format!("{} (HTTP {code})", d.message_es),
        )
    };
    outcome.errors.push(ErrorEntry {
        code: m.and_then(|m| m.code.clone()).unwrap_or(default_code),
        message: m.and_then(|m| m.message.clone()).unwrap_or(default_message),
        message_es: m.and_then(|m| m.message_es.clone()).unwrap_or(default_message_es),
        field: None,
        retryable: m.and_then(|m| m.retryable).unwrap_or(d.retryable),
    });
    outcome
}

/// Copies the values at `pointers` from `src` into a new object of the same shape.
pub fn pick(src: &Value, pointers: &[Pointer]) -> Value {
    let mut out = Value::Object(Map::new());
    for p in pointers {
        copy_at(src, &p.tokens, &mut out);
    }
    out
}

fn copy_at(src: &Value, tokens: &[Option<String>], dst: &mut Value) {
    let Some((first, rest)) = tokens.split_first() else {
        *dst = src.clone();
        return;
    };
    match (first, src) {
        (None, Value::Array(items)) => {
            // New elements start as the container the rest fills; an element an earlier
            // pointer kept whole (even a null) stays as it is.
            let fresh = || {
                if rest.is_empty() {
                    Value::Null
                } else {
                    Value::Object(Map::new())
                }
            };
            if !dst.is_array() {
                *dst = Value::Array(items.iter().map(|_| fresh()).collect());
            }
            if let Value::Array(out) = dst {
                out.resize_with(items.len(), fresh);
                for (s, d) in items.iter().zip(out.iter_mut()) {
                    copy_at(s, rest, d);
                }
            }
        }
        (None, Value::Object(members)) => {
            for (k, s) in members {
                copy_member(k, s, rest, dst);
            }
        }
        (Some(key), Value::Object(members)) => {
            if let Some(s) = members.get(key) {
                copy_member(key, s, rest, dst);
            }
        }
        (Some(key), Value::Array(items)) => {
            let Some(i) = key.parse::<usize>().ok().filter(|i| *i < items.len()) else {
                return;
            };
            match dst {
                // The array a `*` (or a whole copy) made: the element is picked in place.
                Value::Array(out) => {
                    if let Some(d) = out.get_mut(i) {
                        copy_at(&items[i], rest, d);
                    }
                }
                // An indexed pick keeps the element under its index as an object key.
                _ => copy_member(key, &items[i], rest, dst),
            }
        }
        _ => {}
    }
}

fn copy_member(key: &str, src: &Value, rest: &[Option<String>], dst: &mut Value) {
    // Anything but an object here is a value an earlier pointer kept whole (or an array a `*`
    // filled): a later pointer into it changes nothing.
    if let Value::Object(out) = dst {
        // A member a pointer goes through starts as the container the rest fills; one an
        // earlier pointer kept whole (even a null) stays as it is.
        let slot = out.entry(key.to_string()).or_insert_with(|| {
            if rest.is_empty() {
                Value::Null
            } else if src.is_array() && rest.first().is_some_and(Option::is_none) {
                Value::Array(vec![])
            } else {
                Value::Object(Map::new())
            }
        });
        copy_at(src, rest, slot);
    }
}

/// Removes the values at `tokens` (with `*` wildcards).
pub fn redact(v: &mut Value, tokens: &[Option<String>]) {
    let Some((first, rest)) = tokens.split_first() else {
        return;
    };
    match v {
        Value::Object(members) => match first {
            Some(key) if rest.is_empty() => {
                members.remove(key);
            }
            Some(key) => {
                if let Some(child) = members.get_mut(key) {
                    redact(child, rest);
                }
            }
            None if rest.is_empty() => members.clear(),
            None => members.values_mut().for_each(|c| redact(c, rest)),
        },
        Value::Array(items) => match first {
            Some(key) => {
                if let Ok(i) = key.parse::<usize>() {
                    if rest.is_empty() {
                        if i < items.len() {
                            items.remove(i);
                        }
                    } else if let Some(child) = items.get_mut(i) {
                        redact(child, rest);
                    }
                }
            }
            None if rest.is_empty() => items.clear(),
            None => items.iter_mut().for_each(|c| redact(c, rest)),
        },
        _ => {}
    }
}

/// Whether every value the pointer selects is present and not null or empty (at least one).
pub fn present(v: &Value, tokens: &[Option<String>]) -> bool {
    let Some((first, rest)) = tokens.split_first() else {
        return !matches!(v, Value::Null) && v.as_str() != Some("");
    };
    match (first, v) {
        (Some(k), Value::Object(m)) => m.get(k).is_some_and(|c| present(c, rest)),
        (Some(k), Value::Array(a)) => k
            .parse::<usize>()
            .ok()
            .and_then(|i| a.get(i))
            .is_some_and(|c| present(c, rest)),
        (None, Value::Object(m)) => !m.is_empty() && m.values().all(|c| present(c, rest)),
        (None, Value::Array(a)) => !a.is_empty() && a.iter().all(|c| present(c, rest)),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::Runtime;
    use bytes::Bytes;
    use http::HeaderValue;
    use serde_json::json;
    use toolgate_config::parse_yaml;

    fn ptrs(list: &[&str]) -> Vec<Pointer> {
        list.iter().map(|p| Pointer::parse(p).unwrap()).collect()
    }

    fn runtime(response: &str) -> Runtime {
        let text = format!(
            "apiVersion: toolgate.dev/v1alpha1\nkind: ProxyConfig\nupstream: {{baseUrl: 'http://127.0.0.1:9'}}\ntools:\n  - name: t\n    inputSchema: {{type: object}}\n    outputSchema: {{type: object, properties: {{id: {{type: string}}}}}}\n    http: {{method: POST, path: /x}}\n    response: {response}\n"
        );
        Runtime::compile(parse_yaml(&text).unwrap(), 1).unwrap()
    }

    fn resp(status: u16, body: &str) -> UpstreamResponse {
        UpstreamResponse {
            status,
            content_type: Some(HeaderValue::from_static("application/json")),
            body: Bytes::from(body.to_string()),
        }
    }

    #[test]
    fn pick_keeps_only_listed_fields_with_wildcards() {
        let src = json!({"id": "1", "secret": "s", "items": [{"a": 1, "b": 2}, {"a": 3, "b": 4}], "nested": {"x": 1, "y": 2}});
        assert_eq!(
            pick(&src, &ptrs(&["/id", "/items/*/a", "/nested/x", "/missing"])),
            json!({"id": "1", "items": [{"a": 1}, {"a": 3}], "nested": {"x": 1}})
        );
    }

    #[test]
    fn a_wildcard_and_an_index_pick_into_the_same_elements_and_whole_values_stay_whole() {
        let src = json!({"items": [{"id": 1, "name": "a", "x": 0}, {"id": 2, "name": "b"}], "a": [null, {"x": 1}]});
        assert_eq!(
            pick(&src, &ptrs(&["/items/*/id", "/items/0/name"])),
            json!({"items": [{"id": 1, "name": "a"}, {"id": 2}]})
        );
        assert_eq!(
            pick(&src, &ptrs(&["/a", "/a/*/x"])),
            json!({"a": [null, {"x": 1}]}),
            "a null element kept whole is not turned into an object"
        );
        assert_eq!(pick(&src, &ptrs(&["/a/*/x"])), json!({"a": [{}, {"x": 1}]}));
    }

    #[test]
    fn redact_removes_fields_everywhere_the_pointer_matches() {
        let mut v = json!({"a": 1, "b": {"ssn": "x", "k": 1}, "list": [{"ssn": 1, "n": 2}, {"n": 3}]});
        redact(&mut v, &ptrs(&["/b/ssn"])[0].tokens);
        redact(&mut v, &ptrs(&["/list/*/ssn"])[0].tokens);
        assert_eq!(v, json!({"a": 1, "b": {"k": 1}, "list": [{"n": 2}, {"n": 3}]}));
    }

    #[test]
    fn default_statuses_follow_http() {
        let rt = runtime("{}");
        let t = rt.tool("t").unwrap();
        assert_eq!(response(t, &resp(200, r#"{"id":"1"}"#)).status, BusinessStatus::Success);
        assert_eq!(
            response(t, &resp(202, r#"{"jobId":"j"}"#)).status,
            BusinessStatus::Queued
        );
        let nf = response(t, &resp(404, "{}"));
        assert_eq!(nf.status, BusinessStatus::NeedsMoreInfo);
        assert!(nf.next_question.is_some());
        let conflict = response(t, &resp(409, r#"{"candidates":[1,2]}"#));
        assert_eq!(conflict.status, BusinessStatus::PendingConfirmation);
        assert_eq!(conflict.data, Some(json!({"candidates": [1, 2]})));
        let bad = response(t, &resp(422, "{}"));
        assert_eq!((bad.status, bad.errors[0].retryable), (BusinessStatus::Failed, false));
        let down = response(t, &resp(503, r#"{"trace":"internal"}"#));
        assert_eq!(
            (down.status, down.errors[0].retryable, down.data.clone()),
            (BusinessStatus::Failed, true, None)
        );
    }

    #[test]
    fn configured_statuses_override_defaults_exact_before_class() {
        let rt = runtime("{statuses: {'404': {status: failed, code: gone, message: Gone, message_es: Ya no, retryable: true}, '4xx': {status: needs_more_info, nextQuestion: Which one?}}}");
        let t = rt.tool("t").unwrap();
        let gone = response(t, &resp(404, "{}"));
        assert_eq!(
            (
                gone.status,
                gone.errors[0].code.as_str(),
                gone.errors[0].message_es.as_str()
            ),
            (BusinessStatus::Failed, "gone", "Ya no")
        );
        let other = response(t, &resp(418, "{}"));
        assert_eq!(
            (other.status, other.next_question.as_deref()),
            (BusinessStatus::NeedsMoreInfo, Some("Which one?"))
        );
    }

    #[test]
    fn a_2xx_mapped_to_a_pending_status_keeps_its_body_and_says_why() {
        let rt = runtime("{statuses: {'200': {status: pending_confirmation, nextQuestion: Which one?}}}");
        let o = response(rt.tool("t").unwrap(), &resp(200, r#"{"candidates":[{"id":"1"}]}"#));
        assert_eq!(o.status, BusinessStatus::PendingConfirmation);
        assert_eq!(o.data, Some(json!({"candidates": [{"id": "1"}]})));
        assert_eq!(o.errors[0].code, "pending_confirmation");
        assert!(o.errors[0].message.contains("HTTP 200"));
    }

    #[test]
    fn error_pick_limits_what_a_4xx_body_shows() {
        let rt = runtime("{errorPick: [/candidates/*/id]}");
        let o = response(
            rt.tool("t").unwrap(),
            &resp(409, r#"{"candidates":[{"id":"1","ssn":"x"}],"debug":"stack"}"#),
        );
        assert_eq!(o.data, Some(json!({"candidates": [{"id": "1"}]})));
    }

    #[test]
    fn non_json_success_bodies_fail_clearly() {
        let rt = runtime("{}");
        let mut r = resp(200, "hello");
        r.content_type = Some(HeaderValue::from_static("text/plain"));
        let o = response(rt.tool("t").unwrap(), &r);
        assert_eq!(
            (o.status, o.errors[0].code.as_str()),
            (BusinessStatus::Failed, "upstream_invalid_response")
        );
        let o = response(rt.tool("t").unwrap(), &resp(200, "{not json"));
        assert_eq!(o.errors[0].code, "upstream_invalid_response");
    }

    #[test]
    fn missing_evidence_is_never_success() {
        let rt = runtime("{evidence: [/ticketId]}");
        let o = response(rt.tool("t").unwrap(), &resp(201, r#"{"status":"created"}"#));
        assert_eq!(
            (o.status, o.errors[0].code.as_str()),
            (BusinessStatus::Failed, "missing_evidence")
        );
        assert_eq!(o.errors[0].field.as_deref(), Some("/ticketId"));
        let o = response(rt.tool("t").unwrap(), &resp(201, r#"{"ticketId":""}"#));
        assert_eq!(o.status, BusinessStatus::Failed);
        let o = response(rt.tool("t").unwrap(), &resp(201, r#"{"ticketId":"T-1"}"#));
        assert_eq!(o.status, BusinessStatus::Success);
    }

    #[test]
    fn output_contract_violations_fail() {
        let rt = runtime("{}");
        let o = response(rt.tool("t").unwrap(), &resp(200, r#"{"id": 5}"#));
        assert_eq!(
            (o.status, o.errors[0].code.as_str()),
            (BusinessStatus::Failed, "upstream_contract_violation")
        );
        assert_eq!(o.errors[0].field.as_deref(), Some("/id"));
    }

    #[test]
    fn arrays_and_scalars_are_wrapped_into_objects() {
        let rt = runtime("{}");
        let mut rt_tool_resp = resp(200, "[1,2]");
        rt_tool_resp.content_type = None;
        let o = response(rt.tool("t").unwrap(), &rt_tool_resp);
        assert_eq!(o.data, Some(json!({"items": [1, 2]})));
    }

    #[test]
    fn a_pick_without_wildcards_reads_the_body_into_the_kept_members() {
        let rt = runtime("{pick: [/id, /items/0, /nested/x]}");
        let t = rt.tool("t").unwrap();
        assert!(matches!(t.pick, Pick::Tree(_)));
        let o = response(
            t,
            &resp(200, r#"{"secret":{"deep":[1e400]},"nested":{"x":1,"y":2},"id":"7"}"#),
        );
        assert_eq!(o.status, BusinessStatus::Success, "{:?}", o.errors);
        assert_eq!(
            o.data,
            Some(json!({"id": "7", "nested": {"x": 1}})),
            "in pointer order; a dropped member is checked as JSON text only"
        );
        // Not an object at the top: wrapped first (`items`), then picked, as before.
        let o = response(t, &resp(200, r#"[{"a":1},{"b":2}]"#));
        assert_eq!(o.data, Some(json!({"items": {"0": {"a": 1}}})));
        let o = response(t, &resp(200, r#"{"id":"7","extra":tru}"#));
        assert_eq!(
            o.errors[0].code, "upstream_invalid_response",
            "a broken dropped member is refused"
        );
        let mut plain = resp(200, r#"{"id":"7"}"#);
        plain.content_type = Some(HeaderValue::from_static("text/plain"));
        assert_eq!(response(t, &plain).errors[0].code, "upstream_invalid_response");
        assert_eq!(
            response(t, &resp(200, " ")).data,
            Some(json!({})),
            "an empty body is no data"
        );
    }
}
