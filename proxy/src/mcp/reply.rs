//! What a request handler answers: JSON-RPC results and errors as HTTP responses.

use bytes::Bytes;
use http::header::{HeaderValue, CONTENT_TYPE};
use http::{Response, StatusCode};
use serde_json::{json, Value};

use super::record::ToolError;
use super::Body;

pub(super) fn json_response(status: StatusCode, body: &Value) -> Response<Body> {
    let mut resp = Response::new(Body::new(Bytes::from(serde_json::to_vec(body).unwrap_or_default())));
    *resp.status_mut() = status;
    resp.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    resp
}

pub(super) fn rpc_error(
    status: StatusCode,
    id: Option<&Value>,
    code: i64,
    message: impl Into<String>,
    data: Option<Value>,
) -> Response<Body> {
    let mut error = json!({"code": code, "message": message.into()});
    if let Some(d) = data {
        error["data"] = d;
    }
    let mut resp = json_response(
        status,
        &json!({"jsonrpc": "2.0", "id": id.cloned().unwrap_or(Value::Null), "error": error}),
    );
    resp.extensions_mut().insert(RpcCode(code));
    resp
}

/// The JSON-RPC error code of a response, for the requests metric.
#[derive(Clone, Copy)]
pub(super) struct RpcCode(pub(super) i64);

pub(super) fn empty(status: StatusCode) -> Response<Body> {
    let mut resp = Response::new(Body::empty());
    *resp.status_mut() = status;
    resp
}

/// Result of a JSON-RPC request handler.
pub(crate) enum Reply {
    Result(Value),
    /// A result already serialized as JSON (UTF-8 bytes); `tool_error` when it is a tool result
    /// with `isError: true`.
    RawResult {
        json: Vec<u8>,
        tool_error: bool,
    },
    /// A complete HTTP response (rate limiting).
    Http(Response<Body>),
    Error {
        code: i64,
        message: String,
        data: Option<Value>,
    },
}

impl Reply {
    pub(super) fn error(code: i64, message: impl Into<String>) -> Self {
        Reply::Error {
            code,
            message: message.into(),
            data: None,
        }
    }

    pub(super) fn into_response(self, id: &Value) -> Response<Body> {
        match self {
            Reply::Result(result) => {
                json_response(StatusCode::OK, &json!({"jsonrpc": "2.0", "id": id, "result": result}))
            }
            Reply::RawResult {
                json: result,
                tool_error,
            } => {
                let id = serde_json::to_string(id).unwrap_or_else(|_| "null".into());
                let mut body = Vec::with_capacity(result.len() + id.len() + 32);
                body.extend_from_slice(br#"{"jsonrpc":"2.0","id":"#);
                body.extend_from_slice(id.as_bytes());
                body.extend_from_slice(br#","result":"#);
                body.extend_from_slice(&result);
                body.push(b'}');
                let mut resp = Response::new(Body::new(Bytes::from(body)));
                resp.headers_mut()
                    .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
                if tool_error {
                    resp.extensions_mut().insert(ToolError);
                }
                resp
            }
            Reply::Error { code, message, data } => rpc_error(StatusCode::OK, Some(id), code, message, data),
            Reply::Http(resp) => resp,
        }
    }
}
