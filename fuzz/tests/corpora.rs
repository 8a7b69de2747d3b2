//! The fuzz targets on stable: every checked-in corpus and regression input, then a
//! time-boxed mutation loop per target (`TOOLGATE_FUZZ_SECONDS`, default 1; `fuzz/run.sh`
//! sets more). A failing input is written to `fuzz/artifacts/TARGET/` and named in the panic,
//! so `TOOLGATE_FUZZ_REPLAY=PATH` (or a copy in `fuzz/regressions/TARGET/`) replays it.
//!
//! A panic on the proxy's own threads (a request handler) is caught by tokio and would only
//! close a connection; the hook below records it, so it fails the input that caused it.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, Once};
use std::time::{Duration, Instant};

use toolgate_fuzz::mutate::{mutate, Rng};
use toolgate_fuzz::{seeds, Target, TARGETS};

static PANICKED: AtomicBool = AtomicBool::new(false);
static LAST_PANIC: Mutex<String> = Mutex::new(String::new());

fn install_hook() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        std::panic::set_hook(Box::new(|info| {
            PANICKED.store(true, Ordering::SeqCst);
            let thread = std::thread::current().name().unwrap_or("unnamed").to_string();
            let message = format!("[thread {thread}] {info}");
            eprintln!("{message}");
            *LAST_PANIC.lock().unwrap_or_else(|e| e.into_inner()) = message;
        }));
    });
}

fn fuzz_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).to_path_buf()
}

fn inputs_in(dir: &Path) -> Vec<Vec<u8>> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut paths: Vec<PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.is_file())
        .collect();
    paths.sort();
    paths.iter().filter_map(|p| std::fs::read(p).ok()).collect()
}

/// Runs one input; `Err` with the panic message when any thread panicked.
fn run_one(target: Target, input: &[u8]) -> Result<(), String> {
    PANICKED.store(false, Ordering::SeqCst);
    let caught = catch_unwind(AssertUnwindSafe(|| target(input)));
    if caught.is_err() || PANICKED.load(Ordering::SeqCst) {
        return Err(LAST_PANIC.lock().unwrap_or_else(|e| e.into_inner()).clone());
    }
    Ok(())
}

fn fail(name: &str, input: &[u8], message: &str) -> ! {
    let dir = fuzz_dir().join("artifacts").join(name);
    let _ = std::fs::create_dir_all(&dir);
    let path = dir.join(format!("crash-{:016x}", {
        use std::hash::{DefaultHasher, Hash, Hasher};
        let mut h = DefaultHasher::new();
        input.hash(&mut h);
        h.finish()
    }));
    let _ = std::fs::write(&path, input);
    panic!(
        "{name}: {message}\ninput saved to {}: {:?}",
        path.display(),
        String::from_utf8_lossy(input)
    );
}

#[test]
fn every_target_survives_its_corpus_and_mutations() {
    install_hook();
    if let Ok(path) = std::env::var("TOOLGATE_FUZZ_REPLAY") {
        let name = path
            .split('/')
            .rev()
            .nth(1)
            .expect("PATH is DIR/TARGET/FILE")
            .to_string();
        let target = toolgate_fuzz::target(&name).expect("a target of that name");
        let input = std::fs::read(&path).expect("read the input");
        if let Err(m) = run_one(target, &input) {
            fail(&name, &input, &m);
        }
        return;
    }
    let seconds: f64 = std::env::var("TOOLGATE_FUZZ_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1.0);
    let only = std::env::var("TOOLGATE_FUZZ_TARGET").ok();
    let seed: u64 = std::env::var("TOOLGATE_FUZZ_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0x7001_9a7e);
    let all_seeds = seeds::all();
    for (name, target) in TARGETS {
        if only.as_deref().is_some_and(|o| o != *name) {
            continue;
        }
        let mut corpus = inputs_in(&fuzz_dir().join("corpus").join(name));
        corpus.extend(inputs_in(&fuzz_dir().join("regressions").join(name)));
        corpus.extend(
            all_seeds
                .iter()
                .find(|(n, _)| n == name)
                .map(|(_, s)| s.clone())
                .unwrap_or_default(),
        );
        assert!(!corpus.is_empty(), "{name} has no corpus");
        for input in &corpus {
            if let Err(m) = run_one(*target, input) {
                fail(name, input, &m);
            }
        }
        let mut rng = Rng::new(seed ^ name.len() as u64);
        let deadline = Instant::now() + Duration::from_secs_f64(seconds);
        let mut executions = 0u64;
        while Instant::now() < deadline {
            let base = &corpus[rng.below(corpus.len())];
            let other = &corpus[rng.below(corpus.len())];
            let input = mutate(base, other, &mut rng, 8 * 1024);
            if let Err(m) = run_one(*target, &input) {
                fail(name, &input, &m);
            }
            executions += 1;
        }
        eprintln!(
            "{name}: {} corpus inputs, {executions} mutations in {seconds} s, 0 failures",
            corpus.len()
        );
    }
}
