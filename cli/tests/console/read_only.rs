//! `courier --embedded FILE serve` does not hold the file (issue 31, point 11): the
//! application can start while the console serves; the console is read-only while it
//! runs, saying so on every page, and changes the file again once it stopped. It reads
//! the file's workflow history too.

use std::process::{Child, Command, Stdio};
use std::sync::Arc;

use courier::admin::{EmbeddedAdmin, QueueAdmin};
use courier::{Embedded, EntityPath, Transport};
use courier_cli::console::{Console, EmbeddedFile};

use crate::fixture::*;
use crate::http::{csrf_of, http};

/// The `courier` command, killed when the test ends (passed or not).
struct Served(Child);

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts `courier --embedded FILE serve` on a free port; its base URL once it serves.
async fn courier_serve(file: &std::path::Path) -> (Served, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_courier"))
        .args(["serve", "--listen", "127.0.0.1:0", "--embedded"])
        .arg(file)
        .env_remove("COURIER_CONSOLE_TOKEN")
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let served = Served(child);
    let lines = tokio::task::spawn_blocking(move || {
        use std::io::BufRead;
        let mut reader = std::io::BufReader::new(stderr);
        let mut lines = Vec::new();
        for _ in 0..2 {
            let mut line = String::new();
            reader.read_line(&mut line).unwrap();
            lines.push(line);
        }
        // Keep reading, so the command never blocks on a full pipe.
        std::thread::spawn(move || std::io::copy(&mut reader, &mut std::io::sink()));
        lines
    })
    .await
    .unwrap();
    let base = lines[0]
        .split_whitespace()
        .find(|w| w.starts_with("http://"))
        .unwrap_or_else(|| panic!("no address in {lines:?}"))
        .trim_end_matches('/')
        .to_owned();
    assert!(
        lines[1].contains("the application can start while the console serves"),
        "it says at start what it holds: {lines:?}"
    );
    (served, base)
}

/// The application (an `Embedded` broker opened on the same file, as the sign-up example
/// does) starts while `courier serve` serves the file; every page then says read-only,
/// and a resubmit is refused (409) saying why; once the application stopped, the banner
/// is gone and the resubmit goes through, and the file is free again afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_application_starts_while_courier_serve_serves_its_file() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("signup.db");
    let broker = Embedded::open(&file).await.unwrap();
    dead_letter(&broker, "orders", "{}", "shop.PlaceOrder", "test.Poison").await;
    broker.close().await;
    drop(broker);
    let (_served, base) = courier_serve(&file).await;

    let before = http("GET", &format!("{base}/"), &[], None).await;
    assert_eq!(before.status, 200);
    assert!(
        !before.body.contains("id=\"read-only\""),
        "no application yet: {}",
        before.body
    );

    let app = Embedded::open(&file)
        .await
        .expect("the application starts while the console serves its file");
    let pages = ["/", "/dlq?queue=orders", "/sagas", "/timeouts", "/outbox"];
    for p in pages {
        let page = http("GET", &format!("{base}{p}"), &[], None).await;
        assert_eq!(page.status, 200, "{p}: {}", page.body);
        assert!(
            page.body.contains("id=\"read-only\"") && page.body.contains("Read-only."),
            "{p} says read-only: {}",
            page.body
        );
    }
    let dlq = http("GET", &format!("{base}/dlq?queue=orders"), &[], None).await;
    let seq = dlq
        .body
        .split("name=\"one\" value=\"")
        .nth(1)
        .and_then(|s| s.split('"').next())
        .expect("a Resubmit button")
        .to_owned();
    // The file's history is read too (without the lock): the dead letter links to its
    // message's history, which says what to check when there is none.
    let one = http("GET", &format!("{base}/dlq/message?queue=orders&seq={seq}"), &[], None).await;
    assert!(one.body.contains("id=\"history-link\""), "{}", one.body);
    let history = http("GET", &format!("{base}/history/message?id=nope"), &[], None).await;
    assert_eq!(history.status, 404, "{}", history.body);
    assert!(history.body.contains("EndpointBuilder::history"), "{}", history.body);
    let resubmit = format!("csrf={}&queue=orders&one={seq}", csrf_of(&dlq.body));
    let refused = http("POST", &format!("{base}/dlq/resubmit"), &[], Some(&resubmit)).await;
    assert_eq!(refused.status, 409, "{}", refused.body);
    assert!(
        refused.body.contains("in use by a running application"),
        "{}",
        refused.body
    );
    assert_eq!(app.counts(&EntityPath::queue("orders")).await.unwrap().dead_lettered, 1);
    app.close().await;
    drop(app);

    let after = http("GET", &format!("{base}/dlq?queue=orders"), &[], None).await;
    assert!(
        !after.body.contains("id=\"read-only\""),
        "the application stopped: {}",
        after.body
    );
    let done = http("POST", &format!("{base}/dlq/resubmit"), &[], Some(&resubmit)).await;
    assert_eq!(done.status, 303, "{}", done.body);
    let again = Embedded::open(&file)
        .await
        .expect("the console released the file after its change");
    let counts = again.counts(&EntityPath::queue("orders")).await.unwrap();
    assert_eq!((counts.active, counts.dead_lettered), (1, 0));
    again.close().await;
}

/// The same in-process, over `Console::embedded_file`: a saga completion and a delete
/// refused while the application runs, taken once it stopped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_embedded_file_console_is_read_only_while_the_application_runs() {
    let (dir, broker) = broker_file(Arc::new(courier::SystemClock)).await;
    dead_letter(&broker, "orders", "{}", "shop.PlaceOrder", "test.Poison").await;
    let path = dir.path().join("app.db");
    let file = Arc::new(EmbeddedFile::open(&path).await.unwrap());
    assert!(file.read_only_reason().is_some(), "the broker of this process runs it");
    let base = serve(Console::new().embedded_file(file.clone())).await;
    let page = http("GET", &format!("{base}/dlq?queue=orders"), &[], None).await;
    assert!(page.body.contains("id=\"read-only\""), "{}", page.body);
    let seq = file.all_dead_letters("orders").await.unwrap()[0];
    let delete = format!("csrf={}&queue=orders&one={seq}&confirmed=1", csrf_of(&page.body));
    let refused = http("POST", &format!("{base}/dlq/delete"), &[], Some(&delete)).await;
    assert_eq!(refused.status, 409, "{}", refused.body);
    broker.close().await;
    drop(broker);
    assert!(file.read_only_reason().is_none());
    let done = http("POST", &format!("{base}/dlq/delete"), &[], Some(&delete)).await;
    assert_eq!(done.status, 303, "{}", done.body);
    let reads = EmbeddedAdmin::open_read_only(&path).await.unwrap();
    assert!(reads.is_read_only());
    assert!(reads.all_dead_letters("orders").await.unwrap().is_empty());
    assert!(!EmbeddedAdmin::is_in_use(&path), "the change released the file");
}

/// `courier serve` keeps serving when nobody reads its standard error (a pipe whose
/// reader went away, a supervisor that stopped reading): its lines are written with the
/// errors ignored. `eprintln!` panicked there and stopped the console at its first line.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn courier_serve_keeps_serving_when_its_standard_error_is_closed() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("closed.db");
    let broker = Embedded::open(&file).await.unwrap();
    broker.close().await;
    drop(broker);
    let port = {
        let free = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        free.local_addr().unwrap().port()
    };
    let mut child = Command::new(env!("CARGO_BIN_EXE_courier"))
        .args(["serve", "--listen", &format!("127.0.0.1:{port}"), "--embedded"])
        .arg(&file)
        .env_remove("COURIER_CONSOLE_TOKEN")
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Closed before the command writes a line: every write to it fails (EPIPE).
    drop(child.stderr.take());
    let mut served = Served(child);
    let base = format!("http://127.0.0.1:{port}");
    let page = eventually_serving(&base, &mut served).await;
    assert_eq!(page, 200);
}

/// The status of the console's first page once `courier serve` answers; fails if the
/// command ended first.
async fn eventually_serving(base: &str, served: &mut Served) -> u16 {
    for _ in 0..600 {
        if let Some(status) = served.0.try_wait().unwrap() {
            panic!("courier serve ended ({status}) instead of serving");
        }
        if tokio::net::TcpStream::connect(base.trim_start_matches("http://"))
            .await
            .is_ok()
        {
            return http("GET", &format!("{base}/"), &[], None).await.status;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    panic!("courier serve did not serve within 60 s");
}
