//! The `docker` command: whether an engine answers, the test containers, and the removal
//! of those whose process has ended.

use std::process::Command;

use super::owner::{process_runs, remove_when_process_ends};
use super::{OWNER_LABEL, ServerError};

/// Whether `docker info` succeeds.
pub(super) async fn docker_answers() -> bool {
    run(vec!["docker".into(), "info".into()]).await.is_ok()
}

/// Starts a container of `image` with each of `ports` published on a host port Docker
/// picks; returns its id and those ports, in order. It is removed when this process ends
/// ([`remove_when_process_ends`]); the test containers of ended processes are removed
/// first.
pub(super) async fn start_container(
    image: &str,
    ports: &[&str],
    extra: &[&str],
) -> Result<(String, Vec<u16>), ServerError> {
    remove_orphans().await;
    let pid = std::process::id();
    let (random, _) = uuid::Uuid::new_v4().as_u64_pair();
    let name = format!("courier-test-{pid}-{random:016x}");
    // Watched before it exists: a process killed during `docker run` leaves nothing.
    remove_when_process_ends(&name)?;
    let mut command: Vec<String> = ["docker", "run", "-d", "--name", &name]
        .iter()
        .map(|s| (*s).to_owned())
        .collect();
    for port in ports {
        command.push("-p".into());
        command.push(format!("127.0.0.1::{port}"));
    }
    command.push("--label".into());
    command.push(format!("{OWNER_LABEL}={pid}"));
    command.extend(extra.iter().map(|s| (*s).to_owned()));
    command.push(image.to_owned());
    let id = run(command).await?.trim().to_owned();
    let mut host_ports = Vec::with_capacity(ports.len());
    for port in ports {
        let mapped = run(vec!["docker".into(), "port".into(), id.clone(), format!("{port}/tcp")]).await?;
        let host_port = mapped
            .lines()
            .find_map(|line| line.rsplit_once(':').and_then(|(_, p)| p.trim().parse::<u16>().ok()))
            .ok_or_else(|| ServerError::Command {
                command: format!("docker port {id} {port}/tcp"),
                output: mapped.clone(),
            })?;
        host_ports.push(host_port);
    }
    Ok((id, host_ports))
}

/// Removes the labelled containers whose process has ended (best effort): those whose
/// watcher could not run (the engine was down, the machine restarted).
async fn remove_orphans() {
    let format = format!("{{{{.ID}}}} {{{{.Label \"{OWNER_LABEL}\"}}}}");
    let Ok(listing) = run(vec![
        "docker".into(),
        "ps".into(),
        "-a".into(),
        "--filter".into(),
        format!("label={OWNER_LABEL}"),
        "--format".into(),
        format,
    ])
    .await
    else {
        return;
    };
    for line in listing.lines() {
        let Some((id, pid)) = line.split_once(' ') else {
            continue;
        };
        if pid.parse::<u32>().is_ok_and(|pid| !process_runs(pid)) {
            let _ = run(vec![
                "docker".into(),
                "rm".into(),
                "-f".into(),
                "-v".into(),
                id.to_owned(),
            ])
            .await;
        }
    }
}

/// Runs a command to its end; its stdout when it succeeds.
pub(super) async fn run(command: Vec<String>) -> Result<String, ServerError> {
    let line = command.join(" ");
    let result = tokio::task::spawn_blocking(move || {
        let (program, args) = command.split_first().map_or(("", &[][..]), |(p, a)| (p.as_str(), a));
        Command::new(program).args(args).output()
    })
    .await;
    match result {
        Ok(Ok(out)) if out.status.success() => Ok(String::from_utf8_lossy(&out.stdout).into_owned()),
        Ok(Ok(out)) => Err(ServerError::Command {
            command: line,
            output: String::from_utf8_lossy(&out.stderr).trim().to_owned(),
        }),
        Ok(Err(e)) => Err(ServerError::Command {
            command: line,
            output: e.to_string(),
        }),
        Err(e) => Err(ServerError::Command {
            command: line,
            output: e.to_string(),
        }),
    }
}
