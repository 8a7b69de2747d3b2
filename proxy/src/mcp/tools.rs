//! The answers the `tools/*` methods share between protocol eras: the visible tools, a
//! `tools/list` page, a call's result and the reply to invalid arguments.

use std::time::Instant;

use serde_json::{json, Value};
use toolgate_config::BusinessStatus;

use super::{code, Peer, Reply, TOOL_ERROR_VERSION};
use crate::envelope::{self, ErrorEntry, Outcome};
use crate::policy::Identity;
use crate::runtime::{CompiledTool, Runtime};

/// The tools `who` may call, in config order.
pub(crate) fn visible<'a>(rt: &'a Runtime, who: &'a Identity) -> impl Iterator<Item = &'a CompiledTool> {
    let p = &rt.config.policy;
    rt.tools
        .iter()
        .filter(move |t| crate::policy::authorize(p, who, &t.config).is_ok())
}

pub(crate) fn tools_list(rt: &Runtime, peer: &Peer, who: &Identity, params: Option<&Value>) -> Reply {
    let page = rt.config.server.page_size;
    let tools: Vec<&CompiledTool> = visible(rt, who).collect();
    let start = match params.and_then(|p| p.get("cursor")) {
        None | Some(Value::Null) => 0,
        Some(Value::String(c)) => match c.strip_prefix("tg:").and_then(|n| n.parse::<usize>().ok()) {
            Some(n) if n > 0 && n < tools.len() => n,
            _ => {
                return Reply::error(
                    code::INVALID_PARAMS,
                    "Invalid params: unknown or stale `cursor`; list again from the start",
                )
            }
        },
        Some(_) => return Reply::error(code::INVALID_PARAMS, "Invalid params: `cursor` must be a string"),
    };
    let end = (start + page).min(tools.len());
    // The page is written as text from each tool's listing text.
    let page: &[&CompiledTool] = &tools[start..end];
    let mut out = String::with_capacity(page.iter().map(|t| t.listing.text_len() + 1).sum::<usize>() + 96);
    out.push_str(r#"{"tools":["#);
    for (i, t) in page.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        t.listing.write(&mut out);
    }
    out.push(']');
    if end < tools.len() {
        out.push_str(&format!(r#","nextCursor":"tg:{end}""#));
    }
    if peer.session.is_none() {
        // Every page carries the same hint. The list is the same for every caller only when
        // nobody authenticates (all are anonymous); otherwise it depends on who asks.
        let public = rt.config.policy.auth.mode == toolgate_config::AuthMode::None;
        out.push_str(&format!(
            r#","ttlMs":{},"cacheScope":"{}""#,
            rt.config.server.list_ttl_ms,
            if public { "public" } else { "private" }
        ));
    }
    out.push('}');
    Reply::RawResult {
        json: out.into_bytes(),
        tool_error: false,
    }
}

pub(crate) fn finish(tool: &CompiledTool, outcome: &Outcome, started: Instant) -> Reply {
    let ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
    let env = outcome.envelope_json(&tool.config.name, tool.safety.as_str(), ms);
    if env.is_empty() {
        // serde_json writes a `Value` and strings to memory without fail; should that change,
        // the client gets an error rather than a result that is not JSON.
        return Reply::error(
            super::code::INTERNAL_ERROR,
            "Internal error: the result could not be serialized",
        );
    }
    Reply::RawResult {
        json: envelope::call_result_json(&env, outcome.is_error()),
        tool_error: outcome.is_error(),
    }
}

/// The question an agent can put to its user when arguments are wrong: it names the fields
/// (at most three, in the order found) and says what is wrong with each.
fn correction_question(problems: &[ErrorEntry]) -> String {
    let mut fields: Vec<&str> = Vec::new();
    for f in problems
        .iter()
        .filter_map(|p| p.field.as_deref())
        .filter(|f| !f.is_empty())
    {
        if !fields.contains(&f) {
            fields.push(f);
        }
    }
    let what = problems
        .iter()
        .take(3)
        .map(|p| p.message.as_str())
        .collect::<Vec<_>>()
        .join("; ");
    let named = |fs: &[&str]| fs.iter().map(|f| format!("`{f}`")).collect::<Vec<_>>();
    match fields.as_slice() {
        [] => format!("Could you send the details again? {what}."),
        [one] => format!("Could you give me a valid {}? {what}.", named(&[one])[0]),
        many => {
            let mut names = named(&many[..many.len().min(3)]);
            let last = names.pop().unwrap_or_default();
            let more = if many.len() > 3 { ", among others" } else { "" };
            format!(
                "Could you give me valid values for {} and {last}{more}? {what}.",
                names.join(", ")
            )
        }
    }
}

/// Invalid arguments: a JSON-RPC -32602 up to 2025-06-18, a `needs_more_info` tool result from
/// 2025-11-25 on (SEP-1303), so the model sees the errors and can correct itself.
pub(crate) fn invalid_arguments(
    tool: &CompiledTool,
    version: &str,
    problems: Vec<ErrorEntry>,
    started: Instant,
) -> Reply {
    if version >= TOOL_ERROR_VERSION {
        let outcome = Outcome {
            status: BusinessStatus::NeedsMoreInfo,
            data: None,
            next_question: Some(correction_question(&problems)),
            errors: problems,
            upstream_status: None,
        };
        return finish(tool, &outcome, started);
    }
    let first = problems.first().and_then(|p| p.field.clone()).unwrap_or_default();
    let summary = problems
        .iter()
        .map(|p| p.message.as_str())
        .collect::<Vec<_>>()
        .join("; ");
    Reply::Error {
        code: code::INVALID_PARAMS,
        message: format!("Invalid arguments for tool `{}`: {summary}", tool.config.name),
        data: Some(json!({"field": first, "errors": problems})),
    }
}

#[cfg(test)]
mod correction_question_tests {
    use super::*;

    fn problem(field: Option<&str>, message: &str) -> ErrorEntry {
        let e = ErrorEntry::new("invalid_argument", message, message, false);
        match field {
            Some(f) => e.with_field(f),
            None => e,
        }
    }

    #[test]
    fn it_names_the_fields_and_what_is_wrong() {
        let q = correction_question(&[
            problem(Some("customerId"), "`customerId` is required"),
            problem(Some("priority"), "`priority` must be one of low, high"),
            problem(Some("customerId"), "`customerId` must be a string"),
        ]);
        assert_eq!(
            q,
            "Could you give me valid values for `customerId` and `priority`? `customerId` is required; \
             `priority` must be one of low, high; `customerId` must be a string."
        );
        let many: Vec<_> = ["a", "b", "c", "d"]
            .iter()
            .map(|f| problem(Some(f), &format!("`{f}` is required")))
            .collect();
        let q = correction_question(&many);
        assert!(
            q.starts_with("Could you give me valid values for `a`, `b` and `c`, among others?"),
            "{q}"
        );
        assert!(!q.contains("`d` is required"), "at most three reasons: {q}");
        assert_eq!(
            correction_question(&[problem(None, "arguments must be an object")]),
            "Could you send the details again? arguments must be an object."
        );
    }
}
