//! `notifications/cancelled` on the 2025 revisions: the read calls a session may abandon.

use std::sync::atomic::Ordering;

use serde_json::Value;

/// 2025-era `tools/call`s of read tools running on this replica, by session handle and
/// JSON-RPC id, so that the session's `notifications/cancelled` can abort the upstream call
/// (best effort, as the specification says: a notification that reaches another replica, or
/// arrives after the answer, changes nothing). Write calls are never registered: one that
/// started may already have had its effect upstream, so it runs to its end.
#[derive(Default)]
pub struct Cancels {
    calls: std::sync::Mutex<CancelMap>,
    next: std::sync::atomic::AtomicU64,
}

/// (session handle, JSON-RPC id as JSON text) -> (registration token, cancel signal).
/// The JSON-RPC ids in the keys are the clients' choice: SipHash (std's default), not the
/// foldhash of the maps keyed by what the proxy or its config chose.
type CancelMap = std::collections::HashMap<(String, String), (u64, tokio::sync::oneshot::Sender<()>)>;

/// Removes its entry from [`Cancels`] when the call ends, however it ends.
pub struct CancelEntry<'a> {
    cancels: &'a Cancels,
    key: (String, String),
    token: u64,
}

impl Cancels {
    /// Registers a call; the receiver completes when the session cancels it. A second call
    /// with the same session and id (a client reusing an id) replaces the first's entry.
    pub fn register(&self, session: &str, id: &Value) -> (CancelEntry<'_>, tokio::sync::oneshot::Receiver<()>) {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let key = (session.to_string(), id.to_string());
        let token = self.next.fetch_add(1, Ordering::Relaxed);
        self.lock().insert(key.clone(), (token, tx));
        (
            CancelEntry {
                cancels: self,
                key,
                token,
            },
            rx,
        )
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, CancelMap> {
        self.calls.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Cancels the session's call with JSON-RPC id `id`; whether one was running here.
    pub fn cancel(&self, session: &str, id: &Value) -> bool {
        let entry = self.lock().remove(&(session.to_string(), id.to_string()));
        entry.is_some_and(|(_, tx)| tx.send(()).is_ok())
    }

    /// Calls registered now.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// Whether no call is registered.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl Drop for CancelEntry<'_> {
    fn drop(&mut self) {
        let mut map = self.cancels.lock();
        // Only this call's entry: a replacement under the same key stays. One lookup: the key
        // is not needed after this.
        if let std::collections::hash_map::Entry::Occupied(e) = map.entry(std::mem::take(&mut self.key)) {
            if e.get().0 == self.token {
                e.remove();
            }
        }
    }
}
