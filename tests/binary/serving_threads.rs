//! The serving threads of the real binary: each accepts on a listener of its own (the port is
//! shared with `SO_REUSEPORT`, and still refused when another process listens on it), and an
//! idle proxy's threads sleep: with no connection open they are not woken at all (a timer kept
//! pending on a thread with no connection cost three `epoll_wait`s and an eventfd write twice a
//! second per thread). Linux only: it reads the threads' context-switch counts.

use std::io::{Read, Write};
use std::process::Command;
use std::time::Duration;

use crate::common::*;

/// Voluntary context switches of each thread of `pid` whose name starts with `prefix`.
fn switches(pid: u32, prefix: &str) -> Vec<(String, u64)> {
    let mut out = Vec::new();
    for task in std::fs::read_dir(format!("/proc/{pid}/task")).unwrap() {
        let dir = task.unwrap().path();
        let Ok(name) = std::fs::read_to_string(dir.join("comm")) else {
            continue;
        };
        if !name.starts_with(prefix) {
            continue;
        }
        let status = std::fs::read_to_string(dir.join("status")).unwrap();
        let n = status
            .lines()
            .find_map(|l| l.strip_prefix("voluntary_ctxt_switches:"))
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        out.push((format!("{}/{}", name.trim(), dir.display()), n));
    }
    out.sort();
    out
}

fn serve(listen: &str) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_tokenmeter"));
    c.env_remove("TOKENMETER_LOG")
        .args(["serve", "--listen", listen])
        .args(["--upstream", "http://127.0.0.1:9"])
        .args(["--set", "serving_threads=2"]);
    c
}

/// One request on a connection of its own, answered by the proxy itself, read to the close.
fn probe(addr: std::net::SocketAddr) {
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    // A listener no thread accepts on would leave this connection waiting: fail instead.
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s.write_all(b"GET /stats/healthz HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
        .unwrap();
    let mut answer = Vec::new();
    s.read_to_end(&mut answer).unwrap();
    assert!(answer.starts_with(b"HTTP/1.1 200"), "{answer:?}");
}

/// Serving threads' voluntary context switches over 1.5 s, once the pacemaker has stopped: its
/// first tick after the last request still counts that request, the next one (at most 1 s after
/// it) finds none and stops; 600 ms more for a loaded machine's late timers.
fn wakeups_while_quiet(pid: u32) -> u64 {
    std::thread::sleep(Duration::from_millis(1600));
    let before = switches(pid, "tokenmeter-serv");
    assert_eq!(before.len(), 2, "{before:?}");
    std::thread::sleep(Duration::from_millis(1500));
    let after = switches(pid, "tokenmeter-serv");
    after
        .iter()
        .zip(&before)
        .map(|((_, a), (_, b))| a - b)
        .sum()
}

#[test]
#[ignore = "counts wakeups over 1.5 s of real time: scripts/reliability.sh runs it"]
fn serving_threads_sleep_while_no_request_comes() {
    let (child, addr, _log) = spawn_logged(&mut serve("127.0.0.1:0"));
    // Connections served and closed: the kernel spreads them over both threads' listeners.
    for _ in 0..8 {
        probe(addr);
    }
    let woken = wakeups_while_quiet(child.id());
    // A ticking timer makes about six a second per thread; none is due with no request.
    assert!(
        woken <= 1,
        "serving threads woke {woken} times in 1.5 s with no connection open"
    );
    // Keep-alive connections left open, idle (agents' pools hold them): still asleep.
    let mut kept = Vec::new();
    for _ in 0..8 {
        let mut s = std::net::TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        s.write_all(b"GET /stats/healthz HTTP/1.1\r\nhost: x\r\n\r\n")
            .unwrap();
        let mut buf = [0u8; 4096];
        let n = s.read(&mut buf).unwrap();
        assert!(buf[..n].starts_with(b"HTTP/1.1 200"));
        kept.push(s);
    }
    let woken = wakeups_while_quiet(child.id());
    assert!(
        woken <= 1,
        "serving threads woke {woken} times in 1.5 s with 8 idle keep-alive connections"
    );
    drop(kept);
}

#[test]
fn every_serving_thread_accepts_connections() {
    let (child, addr, _log) = spawn_logged(&mut serve("127.0.0.1:0"));
    let before = switches(child.id(), "tokenmeter-serv");
    // 64 connections from as many source ports: the kernel's hash gives both listeners some
    // (all on one would happen with probability 2^-63).
    for _ in 0..64 {
        probe(addr);
    }
    let after = switches(child.id(), "tokenmeter-serv");
    for ((name, a), (_, b)) in after.iter().zip(&before) {
        assert!(
            a - b >= 2,
            "{name} accepted nothing: {before:?} -> {after:?}"
        );
    }
}

#[test]
fn a_port_another_process_listens_on_is_refused() {
    let (_first, addr, _log) = spawn_logged(&mut serve("127.0.0.1:0"));
    let out = serve(&addr.to_string())
        .stdout(std::process::Stdio::null())
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&format!("binding {addr}")) && err.to_lowercase().contains("in use"),
        "{err}"
    );
    // The first still serves.
    probe(addr);
}
