//! The binary as a container runs it: SIGTERM (the kubelet's stop signal) ends it promptly and
//! cleanly, after the request in flight has its answer.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

fn start() -> (Child, String) {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    drop(listener);
    let child = Command::new(env!("CARGO_BIN_EXE_example-service"))
        .args(["--listen", &addr])
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while TcpStream::connect(&addr).is_err() {
        assert!(Instant::now() < deadline, "example-service did not listen on {addr}");
        std::thread::sleep(Duration::from_millis(20));
    }
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
