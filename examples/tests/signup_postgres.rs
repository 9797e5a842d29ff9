//! The sign-up example on Postgres alone (`--transport postgres`), two runs at once on
//! one database (issue 15, point 4): a fresh run, and a second run started once the first
//! has parked its scenario, which is killed with SIGKILL in the middle of the story and
//! run again. Each run hears every handler's news, whichever process handled it (a topic
//! each run subscribes to), so each ends with every user as the script says.
//!
//! The database is one of its own on the test Postgres server
//! (`courier::test_servers::postgres_database`: `DATABASE_URL`'s server, or a container).
//!
//! Time runs 250 times faster, not the example's default 1000: dave clicks his link 5
//! minutes of the story before his deadline, 0.3 s at 1000 times, which a stall of the
//! machine (a build beside CI) once ate: his confirmation came after the expiry. At 250
//! times it is 1.2 s, and the story about 18 s.

#![cfg(unix)]
#![allow(clippy::expect_used, clippy::panic, clippy::print_stdout)] // a test program: a failed step fails the test

use std::io::{BufRead, BufReader, Read};
use std::path::Path;
use std::process::{Child, ChildStdout, Command, Stdio};
use std::sync::mpsc;

const SIGNUP: &str = env!("CARGO_BIN_EXE_signup");

const DONE: &str = "ok: every user ended as the script says";

/// The example on the Postgres transport of `url`, in `dir`, whatever the environment says.
fn signup(dir: &Path, url: &str) -> Command {
    let mut command = Command::new(SIGNUP);
    command
        .current_dir(dir)
        .args(["--transport", "postgres", "--postgres", url, "--scale", "250"])
        .env_remove("DATABASE_URL")
        .env_remove("AMQP_URL")
        .env_remove("COURIER_TRANSPORT")
        .env_remove("RUST_LOG")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    command
}

/// Reads `child`'s stdout line by line in a thread of its own (so that it never blocks
/// on a full pipe): the lines come on the returned channel.
fn lines(child: &mut Child) -> mpsc::Receiver<String> {
    let stdout: ChildStdout = child.stdout.take().expect("piped stdout");
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                return;
            }
        }
    });
    rx
}

/// Takes lines until one satisfies `until`; returns what was read.
fn read_until(lines: &mpsc::Receiver<String>, until: impl Fn(&str) -> bool) -> String {
    let mut read = String::new();
    for line in lines.iter() {
        read.push_str(&line);
        read.push('\n');
        if until(&line) {
            return read;
        }
    }
    panic!("the program ended before the line awaited:\n{read}");
}

/// Waits for `child` to end; its exit, stdout (what `lines` had not read) and stderr.
fn finish(mut child: Child, lines: &mpsc::Receiver<String>, read: &str) -> (bool, String) {
    let status = child.wait().expect("wait");
    let mut out = read.to_owned();
    for line in lines.iter() {
        out.push_str(&line);
        out.push('\n');
    }
    let mut err = String::new();
    if let Some(mut stderr) = child.stderr.take() {
        let _ = stderr.read_to_string(&mut err);
    }
    (
        status.success(),
        format!("exit {:?}\n--- stdout\n{out}--- stderr\n{err}", status.code()),
    )
}

#[test]
fn two_runs_at_once_one_killed_and_run_again_each_end_as_the_script_says() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    let db = runtime
        .block_on(courier::test_servers::postgres_database())
        .expect("a test database: set DATABASE_URL or run a Docker engine");
    let url = db.url();
    let dir = tempfile::tempdir().expect("temp dir");

    let mut first = signup(dir.path(), &url)
        .arg("--fresh")
        .spawn()
        .expect("the example starts");
    let first_lines = lines(&mut first);
    let first_read = read_until(&first_lines, |l| l.starts_with("new scenario"));

    // The second run resumes the scenario the first parked, and shares the work.
    let mut second = signup(dir.path(), &url).spawn().expect("the example starts");
    let second_lines = lines(&mut second);
    let second_read = read_until(&second_lines, |l| l.starts_with('['));
    second.kill().expect("SIGKILL");
    let (second_ok, second_text) = finish(second, &second_lines, &second_read);
    assert!(!second_ok, "the second run was killed mid-story: {second_text}");

    let third = signup(dir.path(), &url).spawn();
    let mut third = third.expect("the example starts");
    let third_lines = lines(&mut third);

    let (first_ok, first_text) = finish(first, &first_lines, &first_read);
    let (third_ok, third_text) = finish(third, &third_lines, "");
    println!("--- the first run\n{first_text}\n--- the run after the kill\n{third_text}");
    assert!(first_ok && first_text.contains(DONE), "the first run: {first_text}");
    assert!(
        third_ok && third_text.contains(DONE),
        "the run after the kill: {third_text}\n--- the killed run\n{second_text}"
    );
    runtime.block_on(db.drop_database()).expect("drop the test database");
}
