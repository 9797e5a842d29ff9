//! Ctrl-C stops every example that runs until it is done (`signup`, `endpoints`, `orders`,
//! `tour`) gracefully. Each is started as a shell script's background job starts it:
//! with SIGINT *ignored* (`trap "" INT`, inherited through `exec`), which is how the
//! sign-up example once ignored SIGINT for good. Once it printed that it is under way it
//! gets SIGINT, and it must install its own handler, stop (shut its endpoints down), say
//! so, and exit with 130 within [`STOP_BOUND`]. All run on the embedded broker (no
//! server), each in a directory of its own.

#![cfg(unix)]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

use std::ffi::OsString;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// How long an example may take from SIGINT to its exit: it stops receiving, hands back
/// what it prefetched and lets running handlers finish (its handlers are short), far less
/// than the endpoints' `shutdown_timeout` of 30 s. Generous for a loaded machine.
const STOP_BOUND: Duration = Duration::from_secs(10);

/// Not a timing assertion: only a guard against a test that would otherwise hang.
const HANG_GUARD: Duration = Duration::from_secs(60);

/// `endpoints`, `orders` and `tour` end by themselves, `endpoints` some 0.1 s after its
/// first line: a run that finished before the signal arrived (exit 0 and its last line)
/// is run again, this many times at most.
const RUNS: usize = 5;

/// One run, interrupted.
struct Run {
    status: ExitStatus,
    /// Everything it printed on stdout.
    out: Vec<String>,
    /// From the SIGINT to the exit.
    stopped_in: Duration,
}

/// Runs `bin` with `args` in `dir`, with SIGINT ignored, sends it SIGINT once it printed
/// a line `ready` accepts, and waits for it to exit.
fn interrupt(bin: &str, args: &[OsString], dir: &Path, ready: fn(&str) -> bool) -> Run {
    let mut child = Command::new("sh")
        .arg("-c")
        .arg("trap '' INT; exec \"$0\" \"$@\"")
        .arg(bin)
        .args(args)
        .current_dir(dir)
        // The embedded broker: no server, nothing shared.
        .env_remove("DATABASE_URL")
        .env_remove("AMQP_URL")
        .env_remove("COURIER_TRANSPORT")
        .env_remove("RUST_LOG")
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
    loop {
        let line = lines.recv_timeout(HANG_GUARD).unwrap_or_else(|_| {
            let _ = child.kill();
            panic!("{bin} did not start: {out:?}")
        });
        let under_way = ready(&line);
        out.push(line);
        if under_way {
            break;
        }
    }
    let sent = Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(sent.success());
    let signalled = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if signalled.elapsed() > HANG_GUARD {
            let _ = child.kill();
            panic!("{bin} ignored SIGINT: still running {HANG_GUARD:?} later; it printed {out:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let stopped_in = signalled.elapsed();
    // The reader ends when the pipe closes: everything printed is in the channel.
    while let Ok(line) = lines.recv_timeout(Duration::from_secs(5)) {
        out.push(line);
    }
    Run {
        status,
        out,
        stopped_in,
    }
}

/// Interrupts `bin` (see [`interrupt`]) in a fresh directory, and checks that it exited
/// with 130 within [`STOP_BOUND`] and printed `interrupted_line`. A run that finished
/// before the signal (exit 0, having printed a line starting with `finished`) is run again.
fn check_interrupted(bin: &str, args: &[&str], ready: fn(&str) -> bool, finished: &str, interrupted_line: &str) -> Run {
    for _ in 0..RUNS {
        let dir = tempfile::tempdir().unwrap();
        let args: Vec<OsString> = args.iter().map(OsString::from).collect();
        let run = interrupt(bin, &args, dir.path(), ready);
        if run.status.success() && run.out.iter().any(|l| l.starts_with(finished)) {
            eprintln!("{bin} finished before the SIGINT arrived: running it again");
            continue;
        }
        assert_eq!(run.status.code(), Some(130), "{bin}: {:#?}", run.out);
        assert!(
            run.out.iter().any(|l| l.contains(interrupted_line)),
            "{bin} did not say it was interrupted: {:#?}",
            run.out
        );
        assert!(
            run.stopped_in < STOP_BOUND,
            "{bin} took {:?} to stop after SIGINT: {:#?}",
            run.stopped_in,
            run.out
        );
        return run;
    }
    panic!("{bin} finished before the SIGINT arrived in each of {RUNS} runs: is it listening for Ctrl-C?")
}

#[test]
fn ctrl_c_stops_the_signup_example_gracefully_even_when_sigint_was_ignored() {
    // The story runs (1 h 10 min in real time) once the scenario is announced.
    let run = check_interrupted(
        env!("CARGO_BIN_EXE_signup"),
        &["--real-time", "--fresh", "--db", "signup.db"],
        |l| l.starts_with("new scenario"),
        "every user",
        "interrupted by Ctrl-C; the endpoints stopped gracefully",
    );
    assert!(
        run.out
            .iter()
            .any(|l| l.starts_with("accounts ") && l.contains("handled")),
        "the endpoints' reports: {:#?}",
        run.out
    );
}

#[test]
fn ctrl_c_stops_the_endpoints_example_gracefully_even_when_sigint_was_ignored() {
    let run = check_interrupted(
        env!("CARGO_BIN_EXE_endpoints"),
        &[],
        |_| true,
        "ok:",
        "endpoints: interrupted by Ctrl-C; the endpoints stopped gracefully",
    );
    // The shutdown reports come before the line that says it was interrupted.
    for endpoint in ["sales", "billing"] {
        assert!(
            run.out
                .iter()
                .any(|l| l.starts_with(&format!("main: {endpoint} stopped:"))),
            "{endpoint}'s report: {:#?}",
            run.out
        );
    }
}

#[test]
fn ctrl_c_stops_the_orders_example_gracefully_even_when_sigint_was_ignored() {
    check_interrupted(
        env!("CARGO_BIN_EXE_orders"),
        &[],
        |_| true,
        "ok:",
        "orders: interrupted by Ctrl-C; the endpoints stopped gracefully",
    );
}

#[test]
fn ctrl_c_stops_the_tour_gracefully_even_when_sigint_was_ignored() {
    // The broker's file in the test's directory (the tour's argument), not the system's
    // temporary directory.
    check_interrupted(
        env!("CARGO_BIN_EXE_tour"),
        &["tour.db"],
        |_| true,
        "tour finished",
        "tour: interrupted by Ctrl-C; stopped",
    );
}

#[test]
fn keep_running_keeps_the_signup_endpoints_until_ctrl_c() {
    // The story at the default speed (about 4 s), then the endpoints keep running: the
    // program is still there when it says so, and Ctrl-C ends it with the story's verdict.
    let dir = tempfile::tempdir().unwrap();
    let args: Vec<OsString> = ["--fresh", "--db", "signup.db", "--keep-running"]
        .iter()
        .map(OsString::from)
        .collect();
    let run = interrupt(env!("CARGO_BIN_EXE_signup"), &args, dir.path(), |l| {
        l.starts_with("--keep-running:")
    });
    assert!(run.status.success(), "{:#?}", run.out);
    assert!(
        run.out
            .iter()
            .any(|l| l.starts_with("accounts ") && l.contains("handled")),
        "the endpoints' reports after Ctrl-C: {:#?}",
        run.out
    );
    assert!(run.stopped_in < STOP_BOUND, "{:?}", run.stopped_in);
}
