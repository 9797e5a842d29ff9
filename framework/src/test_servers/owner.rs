//! Who made a test server's database, virtual host or container, and their removal once
//! that process has ended.
//!
//! Databases and virtual hosts are named `<prefix><host>_<pid>_<random>` (`-` instead of
//! `_` for virtual hosts): `<host>` is 8 hex digits that tell this machine (and its process
//! namespace) apart from the others that may share the server, `<pid>` the id of the
//! process that made it. When a test creates one, the names of this host whose process
//! has ended are dropped first: what a failed or killed test left behind goes at the next
//! run. Whether a process runs is read from `/proc`; without it nothing is dropped.
//!
//! Containers are removed by a watcher started with them: a small `sh` process, in a
//! process group of its own, that reads a pipe whose only writer is the test process. When
//! the test process ends, however it ends (returns, panics, is killed with SIGKILL), the
//! kernel closes the pipe and the watcher runs `docker rm -f -v`.

use std::io::Read;
use std::path::Path;
use std::process::{ChildStdin, Command, Stdio};
use std::sync::{Mutex, OnceLock, PoisonError};

use super::ServerError;

/// The prefix of the test databases' names.
pub(super) const DATABASE_PREFIX: &str = "courier_test_";
/// The prefix of the test virtual hosts' names.
#[cfg(any(feature = "amqp", test))]
pub(super) const VHOST_PREFIX: &str = "courier-test-";

/// 8 hex digits naming this host: FNV-1a over its hostname, `/etc/machine-id` and the
/// process namespace (two containers with one hostname, or two machines, differ).
fn host_tag() -> &'static str {
    static TAG: OnceLock<String> = OnceLock::new();
    TAG.get_or_init(|| {
        let mut text = String::new();
        for file in ["/proc/sys/kernel/hostname", "/etc/machine-id"] {
            if let Ok(mut f) = std::fs::File::open(file) {
                let _ = f.read_to_string(&mut text);
            }
            text.push('\n');
        }
        if let Ok(ns) = std::fs::read_link("/proc/self/ns/pid") {
            text.push_str(&ns.to_string_lossy());
        }
        let hash = text
            .bytes()
            .fold(0x811c_9dc5_u32, |h, b| (h ^ u32::from(b)).wrapping_mul(0x0100_0193));
        format!("{hash:08x}")
    })
}

/// A fresh name: `prefix`, this host's tag, this process's id and 16 random hex digits,
/// joined by `separator`.
pub(super) fn unique_name(prefix: &str, separator: char) -> String {
    let (random, _) = uuid::Uuid::new_v4().as_u64_pair();
    format!(
        "{prefix}{}{separator}{}{separator}{random:016x}",
        host_tag(),
        std::process::id()
    )
}

/// Whether `name` was made by [`unique_name`] on this host by a process that has ended.
pub(super) fn ended_here(name: &str, prefix: &str, separator: char) -> bool {
    let Some(rest) = name.strip_prefix(prefix) else {
        return false;
    };
    let mut parts = rest.split(separator);
    let (Some(host), Some(pid), Some(random), None) = (parts.next(), parts.next(), parts.next(), parts.next()) else {
        return false;
    };
    host == host_tag()
        && random.len() == 16
        && random.bytes().all(|b| b.is_ascii_hexdigit())
        && pid.parse::<u32>().is_ok_and(|pid| !process_runs(pid))
}

/// Whether process `pid` runs on this host; `true` when `/proc` cannot tell (so nothing of
/// it is removed).
pub(super) fn process_runs(pid: u32) -> bool {
    !Path::new("/proc/self").exists() || Path::new(&format!("/proc/{pid}")).exists()
}

/// Removes the container `container` (a name or an id), with its anonymous volumes, once
/// this process has ended, however it ends: returns, panics, or is killed (SIGKILL too).
///
/// For containers your tests start themselves, e.g. with testcontainers, whose own reaper
/// (an image pulled from a registry) is not there, and which live in a `static` whose
/// destructor never runs. The containers [`postgres_database`](super::postgres_database)
/// and [`rabbitmq_vhost`](super::rabbitmq_vhost) start are removed this way.
///
/// It starts a watcher: a `sh` process in a process group of its own (so a Ctrl-C of the
/// tests does not stop it first) that waits for the end of a pipe only this process
/// writes to, then runs `docker rm -f -v` with the environment this process had
/// (`DOCKER_HOST`). A name given before the container exists is fine: a container that was
/// never made is not an error for the watcher. Unix only.
///
/// # Errors
/// [`ServerError::Command`] when `sh` cannot be started.
pub fn remove_when_process_ends(container: &str) -> Result<(), ServerError> {
    /// The write ends of the watchers' pipes: never closed while the process runs.
    static PIPES: Mutex<Vec<ChildStdin>> = Mutex::new(Vec::new());
    // `read` returns false at the end of the pipe; nothing is ever written to it.
    const SCRIPT: &str = r#"trap '' HUP INT; while read -r _; do :; done; exec docker rm -f -v "$1""#;
    let mut command = Command::new("sh");
    command
        .args(["-c", SCRIPT, "courier-test-watcher", container])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    #[cfg(unix)]
    std::os::unix::process::CommandExt::process_group(&mut command, 0);
    let mut child = command.spawn().map_err(|e| ServerError::Command {
        command: format!("sh -c '{SCRIPT}' courier-test-watcher {container}"),
        output: e.to_string(),
    })?;
    if let Some(pipe) = child.stdin.take() {
        PIPES.lock().unwrap_or_else(PoisonError::into_inner).push(pipe);
    }
    // The watcher runs on after `child` is dropped; it ends after this process.
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_name_of_this_process_is_not_ended_and_one_of_a_gone_process_is() {
        let mine = unique_name(DATABASE_PREFIX, '_');
        assert!(mine.len() <= 63, "a Postgres identifier: {mine}");
        assert!(!ended_here(&mine, DATABASE_PREFIX, '_'), "this process runs");
        // Pid 0 is never a process's; the kernel's limit is 2^22.
        let gone = mine.replace(&format!("_{}_", std::process::id()), "_4294967295_");
        assert!(ended_here(&gone, DATABASE_PREFIX, '_'));
        let elsewhere = format!("{DATABASE_PREFIX}00000000_4294967295_0123456789abcdef");
        assert_eq!(ended_here(&elsewhere, DATABASE_PREFIX, '_'), host_tag() == "00000000");
        for other in [
            "courier_test_x",
            "courier_t_a1131b7eb63841dbb29cd2387157a87a",
            "postgres",
            &format!("{gone}_more"),
        ] {
            assert!(!ended_here(other, DATABASE_PREFIX, '_'), "{other}");
        }
        let vhost = unique_name(VHOST_PREFIX, '-');
        assert!(!ended_here(&vhost, VHOST_PREFIX, '-'));
    }
}
