//! The test servers in containers: which engine, which image, and the cleanup of
//! containers that earlier test processes left behind.
//!
//! Images are the repository's own (`containers/*/Containerfile`, built from Debian's
//! packages by `containers/build.sh` on first use, tagged by a hash of their files), or any
//! image named by `COURIER_TEST_POSTGRES_IMAGE` / `COURIER_TEST_RABBITMQ_IMAGE`
//! (`name:tag`, e.g. `postgres:17-alpine` where a registry is reachable).
//!
//! A container serves one test process (a test binary) and lives in a static, whose
//! destructor never runs. It is removed when that process ends, however it ends, by a
//! watcher started with it ([`watched_name`], through
//! `courier::test_servers::remove_when_process_ends`). Every container also carries the
//! label `courier.test.owner` with the id of the process that started it: the first
//! container request of a process removes the containers whose owner is no longer running
//! (those whose watcher could not run), and `scripts/test.sh` does the same when the suite
//! ends, failed or not.

use std::path::PathBuf;
use std::process::Command;
use std::sync::Once;

/// The label every test container carries: the id of the process that started it.
pub const OWNER_LABEL: &str = "courier.test.owner";

/// Which server image a test needs.
#[derive(Debug, Clone, Copy)]
pub enum Server {
    /// Postgres (`containers/postgres`).
    Postgres,
    /// RabbitMQ (`containers/rabbitmq`).
    RabbitMq,
}

impl Server {
    fn dir(self) -> &'static str {
        match self {
            Server::Postgres => "postgres",
            Server::RabbitMq => "rabbitmq",
        }
    }

    fn override_var(self) -> &'static str {
        match self {
            Server::Postgres => "COURIER_TEST_POSTGRES_IMAGE",
            Server::RabbitMq => "COURIER_TEST_RABBITMQ_IMAGE",
        }
    }
}

/// Whether a Docker engine answers on `DOCKER_HOST` or the default socket.
pub fn engine_answers() -> bool {
    match std::env::var("DOCKER_HOST") {
        Ok(host) if host.starts_with("tcp://") => host
            .trim_start_matches("tcp://")
            .parse::<std::net::SocketAddr>()
            .is_ok_and(|a| std::net::TcpStream::connect_timeout(&a, std::time::Duration::from_millis(500)).is_ok()),
        Ok(host) => std::os::unix::net::UnixStream::connect(host.trim_start_matches("unix://")).is_ok(),
        Err(_) => std::os::unix::net::UnixStream::connect("/var/run/docker.sock").is_ok(),
    }
}

/// The image to run for `server`, as (name, tag): the one `COURIER_TEST_*_IMAGE` names,
/// else the repository's own, built by `containers/build.sh` when missing.
///
/// # Errors
/// When the image cannot be built, with the build's own message.
pub fn image(server: Server) -> Result<(String, String), String> {
    let reference = image_reference(server)?;
    match reference.rsplit_once(':') {
        Some((name, tag)) if !name.is_empty() && !tag.contains('/') => Ok((name.to_owned(), tag.to_owned())),
        _ => Ok((reference, "latest".to_owned())),
    }
}

/// [`image`] as one reference (`name:tag`).
///
/// # Errors
/// When the image cannot be built, with the build's own message.
pub fn image_reference(server: Server) -> Result<String, String> {
    match std::env::var(server.override_var()) {
        Ok(reference) => Ok(reference),
        Err(_) => {
            let script = repo_root().join("containers").join("build.sh");
            let out = Command::new("bash")
                .arg(&script)
                .arg(server.dir())
                .stderr(std::process::Stdio::inherit())
                .output()
                .map_err(|e| format!("cannot run {}: {e}", script.display()))?;
            if !out.status.success() {
                return Err(format!(
                    "{} {} failed (see its output above); or name an image with {}=name:tag",
                    script.display(),
                    server.dir(),
                    server.override_var()
                ));
            }
            Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
        }
    }
}

/// Makes `courier::test_servers` start the same images as the harness (the repository's
/// own, built on first use, or those `COURIER_TEST_*_IMAGE` names) instead of the
/// official ones, which need a registry. Only for the servers it will start containers
/// for: when an engine answers and `DATABASE_URL` / `AMQP_URL` is not set. Once per
/// process; call it before the first `postgres_database` / `rabbitmq_vhost`.
///
/// # Panics
/// When an image is needed and cannot be built, with the build's message.
#[allow(clippy::panic)]
pub fn images_for_test_servers() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        if !engine_answers() {
            return;
        }
        if std::env::var_os("DATABASE_URL").is_none() {
            let reference = image_reference(Server::Postgres).unwrap_or_else(|e| panic!("{e}"));
            courier::test_servers::set_postgres_image(&reference);
        }
        if std::env::var_os("AMQP_URL").is_none() {
            let reference = image_reference(Server::RabbitMq).unwrap_or_else(|e| panic!("{e}"));
            courier::test_servers::set_rabbitmq_image(&reference);
        }
    });
}

/// A fresh container name (`courier-test-<pid>-<random>`) whose container, once started
/// under it, is removed when this process ends, however it ends (a watcher started now:
/// `courier::test_servers::remove_when_process_ends`). Pass it to `with_container_name`.
///
/// # Panics
/// When the watcher cannot be started (no `sh`).
#[allow(clippy::panic)]
pub fn watched_name() -> String {
    let name = format!("courier-test-{}-{}", std::process::id(), uuid::Uuid::new_v4().simple());
    courier::test_servers::remove_when_process_ends(&name)
        .unwrap_or_else(|e| panic!("start the watcher of container {name}: {e}"));
    name
}

/// A fresh name for a Docker network of this process's own (`courier-test-<pid>-<random>-net`),
/// for `with_network`: testcontainers creates it with the first container on it and
/// removes it with the last; if this process dies first, the first container request of
/// a later test process removes it ([`remove_orphans`]).
pub fn network_name() -> String {
    format!(
        "courier-test-{}-{}-net",
        std::process::id(),
        uuid::Uuid::new_v4().simple()
    )
}

/// A free TCP port on this host, for a container port mapped to a fixed host port (which a
/// container restart keeps; an ephemeral mapping may change).
///
/// # Errors
/// When no port can be bound.
pub fn free_port() -> std::io::Result<u16> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    Ok(listener.local_addr()?.port())
}

/// The value of [`OWNER_LABEL`] for this process.
pub fn owner() -> String {
    std::process::id().to_string()
}

/// Removes, once per process, the test containers whose owning process has exited
/// (left by a test binary that ended: statics are not dropped), then their networks. Best effort: without
/// the `docker` command nothing is removed.
pub fn remove_orphans() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let Ok(out) = Command::new("docker")
            .args(["ps", "-a", "--filter", &format!("label={OWNER_LABEL}")])
            .args(["--format", &format!("{{{{.ID}}}} {{{{.Label \"{OWNER_LABEL}\"}}}}")])
            .output()
        else {
            return;
        };
        let orphans: Vec<String> = String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|line| {
                let (id, pid) = line.split_once(' ')?;
                let alive = pid
                    .parse::<u32>()
                    .is_ok_and(|p| PathBuf::from(format!("/proc/{p}")).exists());
                (!alive).then(|| id.to_owned())
            })
            .collect();
        if !orphans.is_empty() {
            let _ = Command::new("docker").args(["rm", "-f", "-v"]).args(&orphans).output();
        }
        // The networks of the processes that ended ([`network_name`]), once their
        // containers are gone.
        let Ok(out) = Command::new("docker")
            .args([
                "network",
                "ls",
                "--filter",
                "name=courier-test-",
                "--format",
                "{{.Name}}",
            ])
            .output()
        else {
            return;
        };
        let networks: Vec<String> = String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter(|name| {
                let pid = name.strip_prefix("courier-test-").and_then(|r| r.split('-').next());
                pid.and_then(|p| p.parse::<u32>().ok())
                    .is_some_and(|p| !PathBuf::from(format!("/proc/{p}")).exists())
            })
            .map(str::to_owned)
            .collect();
        if !networks.is_empty() {
            let _ = Command::new("docker").args(["network", "rm"]).args(&networks).output();
        }
    });
}

/// The repository's root (this crate is `tests/` in it).
fn repo_root() -> PathBuf {
    let manifest = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    manifest.parent().map(PathBuf::from).unwrap_or(manifest)
}

/// What to do when no server is there: one line.
pub fn nothing_there(what: &str, url_var: &str, example: &str) -> String {
    format!(
        "these tests need {what}: run scripts/test.sh (it sets up Docker and the test images), or start \
         a Docker engine, or set {url_var}={example}"
    )
}
