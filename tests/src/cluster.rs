//! A RabbitMQ cluster of three nodes for a test of its own: three containers of the test
//! RabbitMQ image on a Docker network of the cluster's own, with one Erlang cookie,
//! clustered at start (`rabbitmqctl stop_app; join_cluster rabbit@<first>; start_app` on
//! the second and third), each AMQP port published on a fixed host port (a restart keeps
//! it) and reached through 127.0.0.1. The test can stop, start, pause and unpause a node
//! (the `docker` command, on the engine `DOCKER_HOST` names).
//!
//! The containers are removed when the cluster is dropped or removed, and when the test
//! process ends however it ends ([`containers::watched_name`]); the network is removed
//! with its last container, or, if the process died first, by the next test process that
//! starts a container ([`containers::remove_orphans`]).
//!
//! There is no fallback without a Docker engine: a cluster cannot be faked on one broker.
//! [`Cluster::start`] then fails saying what to start (as every container test does
//! without `AMQP_URL`); `scripts/test.sh`, which CI runs, provides the engine.

use std::process::Command;
use std::time::Duration;

use testcontainers_modules::testcontainers::core::{IntoContainerPort, WaitFor};
use testcontainers_modules::testcontainers::runners::AsyncRunner;
use testcontainers_modules::testcontainers::{ContainerAsync, GenericImage, ImageExt};

use crate::containers::{self, Server};

/// The Erlang cookie the nodes share (a test cluster on a network of its own).
const COOKIE: &str = "courier-test-cluster-cookie";

/// One node: its container, its name (the container's, also its host name) and its AMQP
/// port on the host.
pub struct ClusterNode {
    container: ContainerAsync<GenericImage>,
    name: String,
    port: u16,
}

impl ClusterNode {
    /// The container's name, also its host name on the cluster's network.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The AMQP port published on the host.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The node's Erlang name, `rabbit@<name>`.
    pub fn node_name(&self) -> String {
        format!("rabbit@{}", self.name)
    }
}

/// Three clustered RabbitMQ nodes.
pub struct Cluster {
    nodes: Vec<ClusterNode>,
}

impl Cluster {
    /// Starts the three nodes and clusters them.
    ///
    /// # Panics
    /// Without a Docker engine (saying what to start), or when a node cannot start or
    /// join.
    #[allow(clippy::panic)]
    pub async fn start() -> Self {
        if !containers::engine_answers() {
            panic!(
                "the RabbitMQ cluster test needs a Docker engine (three RabbitMQ containers on a network of their \
                 own; a single broker given by AMQP_URL cannot stand in for a cluster): run scripts/test.sh, which \
                 starts one, or start dockerd and set DOCKER_HOST"
            );
        }
        containers::remove_orphans();
        let (image, tag) = containers::image(Server::RabbitMq).unwrap_or_else(|e| panic!("{e}"));
        let network = containers::network_name();
        let (a, b, c) = tokio::join!(
            start_node(&image, &tag, &network),
            start_node(&image, &tag, &network),
            start_node(&image, &tag, &network)
        );
        let cluster = Cluster { nodes: vec![a, b, c] };
        let first = cluster.nodes[0].node_name();
        for i in 1..cluster.nodes.len() {
            cluster.rabbitmqctl(i, &["stop_app"]).await;
            cluster.rabbitmqctl(i, &["join_cluster", &first]).await;
            cluster.rabbitmqctl(i, &["start_app"]).await;
        }
        let status = cluster.rabbitmqctl(0, &["cluster_status"]).await;
        for node in &cluster.nodes {
            assert!(
                status.contains(&node.node_name()),
                "{} is not in the cluster: {status}",
                node.node_name()
            );
        }
        cluster
    }

    /// The nodes, in the order of [`url`](Self::url).
    pub fn nodes(&self) -> &[ClusterNode] {
        &self.nodes
    }

    /// One AMQP URL naming the three nodes: `amqp://guest:guest@127.0.0.1:p1,127.0.0.1:p2,127.0.0.1:p3/%2f`,
    /// with `query` after it (`?heartbeat=5`, or empty).
    pub fn url(&self, query: &str) -> String {
        let hosts: Vec<String> = self.nodes.iter().map(|n| format!("127.0.0.1:{}", n.port)).collect();
        format!("amqp://guest:guest@{}/%2f{query}", hosts.join(","))
    }

    /// The node whose port a node URL (as `AmqpTransport::connected_node` gives it)
    /// names.
    ///
    /// # Panics
    /// When it names none of them.
    #[allow(clippy::panic)]
    pub fn node_of(&self, url: &str) -> usize {
        self.nodes
            .iter()
            .position(|n| url.contains(&format!(":{}/", n.port)))
            .unwrap_or_else(|| panic!("{url} names no node of the cluster"))
    }

    /// `docker stop` (RabbitMQ shuts down, closing its connections).
    pub async fn stop(&self, i: usize) {
        docker(&["stop", "-t", "30", &self.nodes[i].name]).await;
    }

    /// `docker start`, then waits until the node runs again (`rabbitmqctl await_startup`).
    pub async fn start_again(&self, i: usize) {
        docker(&["start", &self.nodes[i].name]).await;
        self.await_startup(i).await;
    }

    /// `docker pause`: the node's processes freeze; its TCP connections stay open and
    /// answer nothing. The freeze can fail when a process of the node is in the kernel
    /// and cannot stop in time (a write to a slow disk): the runtime thaws the node again
    /// and says "unable to freeze". Then it is tried again, up to ten times,
    /// half a second apart; any other failure panics at once.
    ///
    /// # Panics
    /// When the node cannot be paused.
    #[allow(clippy::panic)]
    pub async fn pause(&self, i: usize) {
        let name = &self.nodes[i].name;
        for tries in 1.. {
            match docker_output(&["pause", name]).await {
                Ok(_) => return,
                Err(e) if tries < FREEZE_TRIES && e.contains("unable to freeze") => {
                    eprintln!("docker pause {name}: {e}; trying again ({tries} of {FREEZE_TRIES})");
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
                Err(e) => panic!("docker pause {name} failed after {tries} tries: {e}"),
            }
        }
    }

    /// `docker unpause`.
    pub async fn unpause(&self, i: usize) {
        docker(&["unpause", &self.nodes[i].name]).await;
    }

    /// Waits until node `i` runs (`rabbitmqctl await_startup`, which waits for the boot).
    pub async fn await_startup(&self, i: usize) {
        self.rabbitmqctl(i, &["await_startup", "--timeout", "120"]).await;
    }

    /// Runs `rabbitmqctl -q args` on node `i` (retried for up to 60 s while the node's
    /// CLI cannot reach it yet); its output.
    ///
    /// # Panics
    /// When it still fails after 60 s.
    #[allow(clippy::panic)]
    pub async fn rabbitmqctl(&self, i: usize, args: &[&str]) -> String {
        let name = &self.nodes[i].name;
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        loop {
            let mut all = vec!["exec", name.as_str(), "rabbitmqctl", "-q"];
            all.extend_from_slice(args);
            let out = docker_output(&all).await;
            match out {
                Ok(text) => return text,
                Err(e) if tokio::time::Instant::now() >= deadline => {
                    panic!("rabbitmqctl {args:?} on {name} failed: {e}")
                }
                Err(_) => tokio::time::sleep(Duration::from_secs(1)).await,
            }
        }
    }

    /// What node `i` says of the cluster and of `queue` (`rabbitmqctl cluster_status`,
    /// `rabbitmq-queues quorum_status`), for a test that failed to tell; what failed to
    /// run says so in the text.
    pub async fn describe(&self, i: usize, queue: &str) -> String {
        let name = self.nodes[i].name.as_str();
        let mut text = String::new();
        for args in [
            &["exec", name, "rabbitmqctl", "-q", "cluster_status"][..],
            &["exec", name, "rabbitmq-queues", "-q", "quorum_status", queue][..],
            &[
                "exec",
                name,
                "rabbitmqctl",
                "-q",
                "list_queues",
                "name",
                "messages",
                "messages_unacknowledged",
                "consumers",
            ][..],
        ] {
            let out = docker_output(args).await.unwrap_or_else(|e| e);
            text.push_str(&format!("$ {}\n{out}\n", args[2..].join(" ")));
        }
        text
    }

    /// Removes the containers (and with the last, the network).
    pub async fn remove(self) {
        for node in self.nodes {
            // A paused container cannot be removed until it is unpaused.
            let _ = docker_output(&["unpause", &node.name]).await;
            let _ = node.container.rm().await;
        }
    }
}

/// Starts one node on `network` under a watched name, with a fixed host port for AMQP.
/// The port is free when chosen, but another container may take it before this one
/// starts ("port is already allocated"): then it starts again on another port, up to five
/// times.
#[allow(clippy::panic)]
async fn start_node(image: &str, tag: &str, network: &str) -> ClusterNode {
    let mut tries = 0;
    loop {
        tries += 1;
        let name = containers::watched_name();
        let port = containers::free_port().unwrap_or_else(|e| panic!("no free port: {e}"));
        let started = GenericImage::new(image, tag)
            .with_exposed_port(5672.tcp())
            .with_wait_for(WaitFor::message_on_stdout("Server startup complete"))
            .with_network(network)
            .with_hostname(&name)
            .with_env_var("RABBITMQ_NODENAME", format!("rabbit@{name}"))
            .with_env_var("RABBITMQ_ERLANG_COOKIE", COOKIE)
            .with_mapped_port(port, 5672.tcp())
            .with_label(containers::OWNER_LABEL, containers::owner())
            .with_container_name(&name)
            .with_startup_timeout(Duration::from_secs(180))
            .start()
            .await;
        match started {
            Ok(container) => return ClusterNode { container, name, port },
            Err(e) if tries < 5 && e.to_string().contains("already allocated") => {
                // The container was created but could not start: remove it, try another port.
                let _ = docker_output(&["rm", "-f", &name]).await;
            }
            Err(e) => panic!("start a RabbitMQ node of the cluster: {e}"),
        }
    }
}

/// How many times [`Cluster::pause`] tries to freeze a node.
const FREEZE_TRIES: u32 = 10;

/// Runs `docker args`.
///
/// # Panics
/// When it fails.
#[allow(clippy::panic)]
async fn docker(args: &[&str]) {
    if let Err(e) = docker_output(args).await {
        panic!("docker {args:?} failed: {e}");
    }
}

/// Runs `docker args` on a blocking thread; its output, or why it failed.
async fn docker_output(args: &[&str]) -> Result<String, String> {
    let args: Vec<String> = args.iter().map(|a| (*a).to_owned()).collect();
    let shown = args.join(" ");
    tokio::task::spawn_blocking(move || {
        let out = Command::new("docker")
            .args(&args)
            .output()
            .map_err(|e| format!("cannot run docker: {e}"))?;
        if out.status.success() {
            Ok(String::from_utf8_lossy(&out.stdout).into_owned())
        } else {
            Err(format!(
                "docker {shown}: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            ))
        }
    })
    .await
    .map_err(|e| format!("the docker command's task failed: {e}"))?
}
