//! What a killed test process started or made does not stay: its containers are removed
//! once it has ended (the watcher started with each), its databases and vhosts are
//! dropped by the next test that makes one on the same server (their names carry the host
//! and the process id). Each test runs a child process (`courier-test-child`), waits for
//! it to say it is ready, kills it with SIGKILL and polls for the outcome.

use std::ffi::OsString;
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use courier_tests::containers::{self, Server};
use courier_tests::pg::PgServer;
use sqlx::ConnectOptions;

const CHILD: &str = env!("CARGO_BIN_EXE_courier-test-child");

/// Runs the child in `mode` with `env` (a `None` value removes the variable) and waits for
/// its `READY` line: the child and the words after `READY`.
fn start_child(args: &[&str], env: &[(&str, Option<OsString>)]) -> (Child, Vec<String>) {
    let mut command = Command::new(CHILD);
    command.args(args).stdout(Stdio::piped()).stderr(Stdio::inherit());
    for (name, value) in env {
        match value {
            Some(v) => command.env(name, v),
            None => command.env_remove(name),
        };
    }
    let mut child = command.spawn().unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let mut words = line.split_whitespace().map(str::to_owned);
    assert_eq!(words.next().as_deref(), Some("READY"), "the child said {line:?}");
    (child, words.collect())
}

/// Polls `check` every 200 ms until it holds, failing after `bound` (a bound on the
/// outcome, not a measure of speed).
async fn within<F, Fut>(what: &str, bound: Duration, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + bound;
    while !check().await {
        assert!(tokio::time::Instant::now() < deadline, "{what}: not within {bound:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The ids of the containers labelled as started by process `pid`.
fn containers_of(pid: u32) -> Vec<String> {
    let out = Command::new("docker")
        .args(["ps", "-a", "-q", "--filter"])
        .arg(format!("label={}={pid}", containers::OWNER_LABEL))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "docker ps: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_owned)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_test_process_leaves_no_container() {
    // The watcher itself, on a `docker` that only writes down what it is asked: nothing
    // while the process runs, `rm -f -v <name>` once it is killed.
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("docker.log");
    let fake = dir.path().join("docker");
    std::fs::write(&fake, "#!/bin/sh\necho \"$@\" >>\"$COURIER_FAKE_DOCKER_LOG\"\n").unwrap();
    std::fs::set_permissions(&fake, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let path = std::env::join_paths(
        std::iter::once(dir.path().to_path_buf()).chain(std::env::split_paths(&std::env::var_os("PATH").unwrap())),
    )
    .unwrap();
    let name = format!("courier-test-fake-{}", uuid::Uuid::new_v4().simple());
    let (mut child, _) = start_child(
        &["watch", &name],
        &[
            ("PATH", Some(path)),
            ("COURIER_FAKE_DOCKER_LOG", Some(log.clone().into_os_string())),
        ],
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!log.exists(), "the watcher ran docker while its process runs");
    child.kill().unwrap();
    child.wait().unwrap();
    within("the watcher's docker rm", Duration::from_secs(30), || async {
        std::fs::read_to_string(&log).is_ok_and(|l| l.trim() == format!("rm -f -v {name}"))
    })
    .await;

    // Real containers, when an engine answers: the harness's (testcontainers) and
    // courier::test_servers's, from the repository's Postgres image.
    if !containers::engine_answers() {
        eprintln!("no Docker engine: the watcher was checked on a stand-in docker only");
        return;
    }
    let image = containers::image_reference(Server::Postgres).unwrap();
    let (mut child, _) = start_child(
        &["containers"],
        &[
            ("DATABASE_URL", None),
            ("COURIER_TEST_POSTGRES_IMAGE", Some(image.into())),
        ],
    );
    let pid = child.id();
    assert_eq!(containers_of(pid).len(), 2, "the child's two containers run");
    child.kill().unwrap();
    child.wait().unwrap();
    within(
        "the killed process's containers removed",
        Duration::from_secs(60),
        || async { containers_of(pid).is_empty() },
    )
    .await;
}

/// The names of the databases on `server` among `names`.
async fn existing(server: &PgServer, names: &[String]) -> Vec<String> {
    let mut conn = server.admin.connect().await.unwrap();
    sqlx::query_scalar("SELECT datname::text FROM pg_database WHERE datname::text = ANY($1) ORDER BY 1")
        .bind(names)
        .fetch_all(&mut conn)
        .await
        .unwrap()
}

async fn vhosts() -> String {
    let out = tokio::process::Command::new("rabbitmqctl")
        .args(["list_vhosts", "--silent", "name"])
        .output()
        .await
        .unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_a_killed_test_process_made_on_shared_servers_is_dropped_by_the_next_test() {
    let server = PgServer::shared().await;
    let admin_url = server.admin.to_url_lossy().to_string();
    // The vhost half on the broker AMQP_URL names (its vhosts are made with rabbitmqctl
    // on this machine); a broker in a container goes with its container.
    let amqp = std::env::var_os("AMQP_URL");
    let (mut child, made) = start_child(
        &["databases"],
        &[("DATABASE_URL", Some(admin_url.into())), ("AMQP_URL", amqp.clone())],
    );
    let databases = made[..2].to_vec();
    let mut sorted = databases.clone();
    sorted.sort();
    assert_eq!(existing(server, &databases).await, sorted);
    // Made while the child runs: its databases stay.
    let mine = server.database().await;
    assert_eq!(
        existing(server, &databases).await,
        sorted,
        "a running process's databases stay"
    );

    child.kill().unwrap();
    child.wait().unwrap();
    let next = server.database().await;
    assert_eq!(
        existing(server, &databases).await,
        Vec::<String>::new(),
        "the next database made on the server dropped the killed process's"
    );
    mine.drop_now().await;
    next.drop_now().await;

    if amqp.is_some() {
        let vhost = &made[2];
        assert!(vhosts().await.lines().any(|v| v == vhost));
        let next = courier::test_servers::rabbitmq_vhost().await.unwrap();
        assert!(
            !vhosts().await.lines().any(|v| v == vhost),
            "the next vhost made on the broker deleted the killed process's"
        );
        next.delete().await.unwrap();
    } else {
        eprintln!("no AMQP_URL: the vhost half did not run (a broker in a container goes with it)");
    }
}
