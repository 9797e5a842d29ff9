//! The sign-up example killed (SIGKILL) during its final audit and run again, round after
//! round, on the embedded default (no server): every run after a kill must end with every
//! user as the script says (issue 21: the next run counted the replies to the killed run's
//! queued `Audit` messages as its own and waited for an answer that never came).
//!
//! Each test runs the example binary in a temporary directory of its own, with the
//! server URLs removed from its environment.

#![cfg(unix)]
#![allow(clippy::expect_used, clippy::print_stdout)] // a test program: a failed step fails the test

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

const SIGNUP: &str = env!("CARGO_BIN_EXE_signup");

/// Kill-and-rerun rounds: a round costs about 0.1 s on the embedded broker.
const ROUNDS: u64 = 40;

/// The line after which a resumed run whose users are all settled audits the sagas of
/// `users` and `accounts`, which takes some 10-20 ms: the kill comes 0-14 ms later.
const BEFORE_FINAL_AUDIT: &str = "where the users stand:";

/// The example on the embedded broker in `dir`, whatever the environment says.
fn signup(dir: &Path) -> Command {
    let mut command = Command::new(SIGNUP);
    command
        .current_dir(dir)
        .args(["--db", "signup.db"])
        .env_remove("DATABASE_URL")
        .env_remove("AMQP_URL")
        .env_remove("RUST_LOG");
    command
}

fn text(output: &Output) -> String {
    format!(
        "exit {:?}\n--- stdout\n{}--- stderr\n{}",
        output.status.code(),
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

/// Starts a resumed run, kills it `delay` after it printed [`BEFORE_FINAL_AUDIT`]; returns
/// whether it was killed (it may have finished first) and what it printed.
fn run_and_kill(dir: &Path, delay: Duration) -> (bool, String) {
    let mut child = signup(dir)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("the example starts");
    let stdout = child.stdout.take().expect("piped stdout");
    let mut lines = BufReader::new(stdout).lines();
    let mut printed = String::new();
    for line in lines.by_ref() {
        let line = line.expect("utf-8 output");
        printed.push_str(&line);
        printed.push('\n');
        if line == BEFORE_FINAL_AUDIT {
            std::thread::sleep(delay);
            break;
        }
    }
    let running = child.try_wait().expect("try_wait").is_none();
    child.kill().expect("SIGKILL");
    for line in lines.map_while(Result::ok) {
        printed.push_str(&line);
        printed.push('\n');
    }
    let status = child.wait().expect("wait");
    let killed = running && status.code().is_none();
    assert!(
        killed || status.success(),
        "a run not killed must succeed: {status:?}\n{printed}"
    );
    (killed, printed)
}

#[test]
fn killed_during_its_final_audit_and_run_again() {
    let dir = tempfile::tempdir().expect("temp dir");
    let first = signup(dir.path()).arg("--fresh").output().expect("the example runs");
    assert!(first.status.success(), "the first run failed: {}", text(&first));

    let mut killed_rounds = 0;
    let mut ignored_rounds = 0;
    for round in 0..ROUNDS {
        let delay = Duration::from_millis(round * 5 % 15);
        let (killed, printed) = run_and_kill(dir.path(), delay);
        killed_rounds += u64::from(killed);

        let rerun = signup(dir.path()).output().expect("the example runs");
        let out = String::from_utf8_lossy(&rerun.stdout);
        assert!(
            rerun.status.success() && out.contains("ok: every user ended as the script says"),
            "round {round}: the run after a kill {delay:?} into the audit failed: {}\n\
             --- the killed run printed\n{printed}",
            text(&rerun)
        );
        if out.contains("repl") && out.contains("to other audits") {
            ignored_rounds += 1;
        }
    }
    println!(
        "{killed_rounds} of {ROUNDS} runs killed; {ignored_rounds} runs after them ignored replies to their audit"
    );
    // The rounds did what they are for: most runs were killed mid-way, and some left
    // Audit messages whose replies the next run ignored (and said so).
    assert!(
        killed_rounds >= ROUNDS / 2,
        "only {killed_rounds} of {ROUNDS} runs were killed"
    );
    assert!(
        ignored_rounds > 0,
        "no run reported replies to a killed run's audit ({killed_rounds} of {ROUNDS} runs killed)"
    );
}
