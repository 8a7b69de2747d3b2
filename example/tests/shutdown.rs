//! The binary as a container runs it: SIGTERM (the kubelet's stop signal) ends it promptly and
//! cleanly, after the request in flight has its answer.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Starts the binary on a port it picks itself (a port picked here and released for it to
/// bind could be taken meanwhile, by the other test's service too); returns it and its
/// address once it says it listens, which is after it handles SIGTERM.
fn start() -> (Child, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_example-service"))
        .args(["--listen", "127.0.0.1:0"])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let first = lines.next().expect("example-service said nothing").unwrap();
    let addr = first
        .strip_prefix("example-service listening on http://")
        .unwrap_or_else(|| panic!("unexpected first line: {first}"))
        .to_string();
    // Whatever else it says is read, so a write to stderr never fails.
    std::thread::spawn(move || lines.for_each(drop));
    (child, addr)
}

fn sigterm(child: &Child) {
    let status = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
}

fn wait_exit(child: &mut Child, within: Duration) -> std::process::ExitStatus {
    let deadline = Instant::now() + within;
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("example-service still running {within:?} after SIGTERM");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn sigterm_ends_an_idle_service_at_once() {
    let (mut child, addr) = start();
    // An idle keep-alive connection must not hold the shutdown up.
    let mut idle = TcpStream::connect(&addr).unwrap();
    idle.write_all(b"GET /health HTTP/1.1\r\nhost: x\r\n\r\n").unwrap();
    let mut buf = [0u8; 512];
    assert!(idle.read(&mut buf).unwrap() > 0);
    sigterm(&child);
    let status = wait_exit(&mut child, Duration::from_secs(3));
    assert!(status.success(), "exit status {status}");
    assert!(TcpStream::connect(&addr).is_err(), "still accepting after exit");
}

#[test]
fn sigterm_lets_the_request_in_flight_finish() {
    let (mut child, addr) = start();
    let mut slow = TcpStream::connect(&addr).unwrap();
    slow.write_all(b"GET /slow?ms=800 HTTP/1.1\r\nhost: x\r\n\r\n").unwrap();
    std::thread::sleep(Duration::from_millis(200));
    sigterm(&child);
    slow.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut answer = Vec::new();
    let mut buf = [0u8; 1024];
    loop {
        match slow.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => answer.extend_from_slice(&buf[..n]),
            Err(e) => panic!("reading the in-flight answer: {e}"),
        }
    }
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    let status = wait_exit(&mut child, Duration::from_secs(3));
    assert!(status.success(), "exit status {status}");
}
