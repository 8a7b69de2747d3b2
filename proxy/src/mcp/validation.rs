//! Schema work kept off the runtime's workers: argument validation in place only for small
//! requests against a compiled schema, everything else on the blocking pool in a bounded number
//! of slots and within a deadline, and each tool's schemas compiled there on first use.

use std::sync::Arc;

use serde_json::Value;
use toolgate_config::schema::LazyValidator;

use super::Shared;
use crate::envelope::ErrorEntry;
use crate::runtime::Runtime;

/// Requests up to this size, for a schema without `$ref`, have their arguments validated in
/// place, every violation listed; the others on the blocking pool, so that no schema and no
/// argument object can stall the runtime's workers (the probes, every other call), with only the
/// first violation of a large request listed.
const INLINE_VALIDATION_BYTES: usize = 32 * 1024;
/// The longest the validation of one call may take, waiting for a validation slot included.
pub const VALIDATION_DEADLINE: std::time::Duration = std::time::Duration::from_secs(2);
/// Validations off the workers at once, at most (each holds a copy of its arguments).
pub const MAX_VALIDATION_SLOTS: usize = 4;

/// Validation slots (and compile slots): one per CPU, at most [`MAX_VALIDATION_SLOTS`].
pub(crate) fn validation_slots() -> usize {
    std::thread::available_parallelism()
        .map_or(1, usize::from)
        .min(MAX_VALIDATION_SLOTS)
}

/// Validates the arguments of `rt.tools[index]` within [`VALIDATION_DEADLINE`]; `None` when it
/// did not finish in time (the validation still runs to its end on its blocking thread and holds
/// its slot until then, so at most [`MAX_VALIDATION_SLOTS`] such threads exist).
pub(super) async fn validate_bounded(
    shared: &Shared,
    rt: &Arc<Runtime>,
    index: usize,
    args: &Value,
    body_bytes: usize,
) -> Option<Vec<ErrorEntry>> {
    let tool = &rt.tools[index];
    let small = body_bytes <= INLINE_VALIDATION_BYTES;
    let deadline = tokio::time::Instant::now() + VALIDATION_DEADLINE;
    // A tool's first call compiles its schema on the blocking pool: no worker compiles a
    // schema, or waits there for another thread compiling the same one (a one-worker sidecar
    // would stall every other call meanwhile).
    compile_off_worker(&shared.compile_slots, &tool.input, deadline).await?;
    // In place only with the schema compiled (a compile that failed is tried again, and
    // reported, on the pool).
    if small && !tool.input_has_refs && tool.input.is_compiled() {
        return Some(super::args::validate(&tool.input, args, true));
    }
    let slot = Arc::clone(&shared.validation_slots);
    let permit = tokio::time::timeout_at(deadline, slot.acquire_owned())
        .await
        .ok()?
        .ok()?;
    let (rt, args) = (Arc::clone(rt), args.clone());
    let task = tokio::task::spawn_blocking(move || {
        let _permit = permit;
        super::args::validate(&rt.tools[index].input, &args, small)
    });
    tokio::time::timeout_at(deadline, task).await.ok()?.ok()
}

/// Compiles `validator` on the blocking pool, in a compile slot, unless it is compiled already;
/// `None` when that did not end by `deadline` (the compile still runs to its end on its
/// thread). Concurrent first calls of a tool wait in their own threads for one compile.
pub(super) async fn compile_off_worker(
    slots: &Arc<tokio::sync::Semaphore>,
    validator: &Arc<LazyValidator>,
    deadline: tokio::time::Instant,
) -> Option<()> {
    if validator.is_compiled() {
        return Some(());
    }
    let permit = tokio::time::timeout_at(deadline, Arc::clone(slots).acquire_owned())
        .await
        .ok()?
        .ok()?;
    let validator = Arc::clone(validator);
    let compile = tokio::task::spawn_blocking(move || {
        let _permit = permit;
        let _ = validator.get();
    });
    // A compile that panicked leaves the validator uncompiled: the caller finds it so.
    let _ = tokio::time::timeout_at(deadline, compile).await.ok()?;
    Some(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use std::time::Instant;

    /// The proxy's shared state over a config of one tool `t` with `input_schema` (YAML).
    fn one_tool(input_schema: &str) -> Shared {
        let config = toolgate_config::parse_yaml(&format!(
            "apiVersion: toolgate.dev/v1alpha1\nkind: ProxyConfig\nupstream: {{baseUrl: 'http://127.0.0.1:1'}}\npolicy: {{audit: {{enabled: false}}}}\ntools:\n  - {{name: t, inputSchema: {input_schema}, http: {{method: GET, path: /}}}}\n"
        ))
        .unwrap();
        Shared::new(Runtime::compile(config, 1).unwrap())
    }

    #[tokio::test]
    async fn validation_that_cannot_start_in_time_gives_up_at_the_deadline() {
        let shared = one_tool("{type: object}");
        let rt = shared.runtime.load_full();
        let args = json!({"a": 1});
        assert_eq!(
            validate_bounded(&shared, &rt, 0, &args, 10).await,
            Some(vec![]),
            "small: compiled on the pool (a first call)"
        );
        assert!(rt.tools[0].input.is_compiled());
        assert_eq!(
            validate_bounded(&shared, &rt, 0, &args, 10).await,
            Some(vec![]),
            "small: in place"
        );
        assert_eq!(
            validate_bounded(&shared, &rt, 0, &args, 1 << 20).await,
            Some(vec![]),
            "large: on the pool"
        );
        // Every slot busy (other large calls still validating): this one waits no longer than the deadline.
        let slots = Arc::clone(&shared.validation_slots);
        let n = u32::try_from(slots.available_permits()).unwrap();
        let _held = slots.acquire_many_owned(n).await.unwrap();
        let started = Instant::now();
        assert_eq!(validate_bounded(&shared, &rt, 0, &args, 1 << 20).await, None);
        let waited = started.elapsed();
        assert!(
            waited >= VALIDATION_DEADLINE && waited < VALIDATION_DEADLINE * 2,
            "{waited:?}"
        );
    }

    #[tokio::test]
    async fn a_first_call_compiles_its_schema_off_the_worker() {
        let shared = one_tool("{type: object, properties: {a: {type: string}, b: {type: integer}}}");
        let rt = shared.runtime.load_full();
        let args = json!({"a": 1, "b": "x"});
        assert!(!rt.tools[0].input.is_compiled(), "loading keeps the schema as text");
        // Every compile slot busy: a small first call does not compile the schema in place, it
        // waits for a slot.
        let slots = Arc::clone(&shared.compile_slots);
        let n = u32::try_from(slots.available_permits()).unwrap();
        let held = Arc::clone(&slots).acquire_many_owned(n).await.unwrap();
        let waiting = tokio::time::timeout(
            std::time::Duration::from_millis(50),
            validate_bounded(&shared, &rt, 0, &args, 10),
        )
        .await;
        assert!(waiting.is_err(), "a first call waits for a slot: {waiting:?}");
        assert!(!rt.tools[0].input.is_compiled());
        drop(held);
        // With a slot it compiles on the pool and still lists every violation of a small call.
        let problems = validate_bounded(&shared, &rt, 0, &args, 10).await.unwrap();
        assert_eq!(problems.len(), 2, "{problems:?}");
        assert!(rt.tools[0].input.is_compiled());
        // Compiled: later small calls validate in place, needing no slot of either kind.
        let _held = slots.acquire_many_owned(n).await.unwrap();
        let validation = Arc::clone(&shared.validation_slots);
        let v = u32::try_from(validation.available_permits()).unwrap();
        let _held_too = validation.acquire_many_owned(v).await.unwrap();
        let problems = tokio::time::timeout(
            std::time::Duration::from_secs(5),
            validate_bounded(&shared, &rt, 0, &args, 10),
        )
        .await
        .expect("in place, no slot needed")
        .unwrap();
        assert_eq!(problems.len(), 2, "{problems:?}");
    }
}
