//! Ctrl-C stops the sign-up example gracefully. The example is started as a shell
//! script's background job starts: with SIGINT *ignored* (`trap "" INT`, inherited
//! through `exec`), which is how it once ignored SIGINT for good. It must install its own
//! handler, shut its endpoints down, say so, and exit with 130.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// Not a timing assertion: only a guard against a test that would otherwise hang.
const HANG_GUARD: Duration = Duration::from_secs(60);

#[test]
fn ctrl_c_stops_the_signup_example_gracefully_even_when_sigint_was_ignored() {
    let dir = std::env::temp_dir().join(format!("courier-ctrl-c-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let db = dir.join("signup.db");
    let mut child = Command::new("sh")
        .arg("-c")
        .arg("trap '' INT; exec \"$0\" \"$@\"")
        .arg(env!("CARGO_BIN_EXE_signup"))
        .args(["--real-time", "--fresh", "--db"])
        .arg(&db)
        // The embedded broker and its own file: no server, nothing shared.
        .env_remove("DATABASE_URL")
        .env_remove("AMQP_URL")
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let (tx, lines) = mpsc::channel();
    let stdout = child.stdout.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let mut out = Vec::new();
    // The story runs (1 h 10 min in real time) once the scenario is announced.
    loop {
        let line = lines
            .recv_timeout(HANG_GUARD)
            .unwrap_or_else(|_| panic!("the example did not start: {out:?}"));
        let started = line.starts_with("new scenario");
        out.push(line);
        if started {
            break;
        }
    }
    let sent = Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(sent.success());
    let deadline = Instant::now() + HANG_GUARD;
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("the example ignored SIGINT: still running {HANG_GUARD:?} later; it printed {out:?}");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    out.extend(lines.try_iter());
    while let Ok(line) = lines.recv_timeout(Duration::from_secs(1)) {
        out.push(line);
    }
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(status.code(), Some(130), "{out:#?}");
    assert!(
        out.iter()
            .any(|l| l.contains("interrupted by Ctrl-C; the endpoints stopped gracefully")),
        "{out:#?}"
    );
    assert!(
        out.iter().any(|l| l.starts_with("accounts ") && l.contains("handled")),
        "the endpoints' reports: {out:#?}"
    );
}
