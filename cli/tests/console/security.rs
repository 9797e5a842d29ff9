//! Security: the CSRF token, the access token and the login, loopback only without a
//! token, and no connection password on any page.

use std::process::{Command, Stdio};
use std::sync::Arc;

use courier::admin::{EmbeddedAdmin, QueueAdmin};
use courier::{Embedded, Transport};
use fantoccini::Locator;

use crate::browser::Browser;
use crate::fixture::*;
use crate::http::{csrf_of, http};

/// (d) Without the CSRF token (or from another origin) a change is refused with 403; with
/// a token configured, a request without it is refused with 401; a login sets a cookie
/// that lets the browser in; a console without a token refuses a non-loopback Host.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn changes_need_the_csrf_token_and_requests_the_access_token() {
    let (_dir, broker) = broker_file(Arc::new(courier::SystemClock)).await;
    let admin = EmbeddedAdmin::new(broker.clone());
    dead_letter(&broker, "orders", "{}", "shop.PlaceOrder", "test.Poison").await;
    let seq = admin.all_dead_letters("orders").await.unwrap()[0];
    let token = "console-test-token-0123456789";
    let base = serve(over(&admin).token(token)).await;
    let bearer = format!("Bearer {token}");
    let auth = [("authorization", bearer.as_str())];

    let anonymous = http("GET", &format!("{base}/"), &[], None).await;
    assert_eq!(anonymous.status, 401);
    assert!(anonymous.body.contains("name=\"token\""), "the login form");
    let change = format!("queue=orders&one={seq}");
    let no_token = http("POST", &format!("{base}/dlq/delete"), &[], Some(&change)).await;
    assert_eq!(no_token.status, 401);

    let page = http("GET", &format!("{base}/dlq?queue=orders"), &auth, None).await;
    assert_eq!(page.status, 200);
    let csrf = csrf_of(&page.body);
    let no_csrf = http(
        "POST",
        &format!("{base}/dlq/delete"),
        &auth,
        Some(&format!("{change}&confirmed=1")),
    )
    .await;
    assert_eq!(no_csrf.status, 403, "{}", no_csrf.body);
    let wrong = http(
        "POST",
        &format!("{base}/dlq/delete"),
        &auth,
        Some(&format!("{change}&confirmed=1&csrf=x{csrf}")),
    )
    .await;
    assert_eq!(wrong.status, 403);
    let origin = [("authorization", bearer.as_str()), ("origin", "https://evil.example")];
    let foreign = http(
        "POST",
        &format!("{base}/dlq/delete"),
        &origin,
        Some(&format!("{change}&confirmed=1&csrf={csrf}")),
    )
    .await;
    assert_eq!(foreign.status, 403);
    let get_changes_nothing = http(
        "GET",
        &format!("{base}/dlq/delete?{change}&confirmed=1&csrf={csrf}"),
        &auth,
        None,
    )
    .await;
    assert_eq!(get_changes_nothing.status, 405);
    assert_eq!(dead_count(&admin, "orders").await, 1, "nothing was deleted");

    let ok = http(
        "POST",
        &format!("{base}/dlq/delete"),
        &auth,
        Some(&format!("{change}&confirmed=1&csrf={csrf}")),
    )
    .await;
    assert_eq!(ok.status, 303, "{}", ok.body);
    assert_eq!(dead_count(&admin, "orders").await, 0);

    // The login form in the browser: a wrong token, then the right one.
    let b = Browser::start().await;
    b.client.goto(&format!("{base}/")).await.unwrap();
    assert_eq!(b.text("h1").await, "Log in");
    let login = b.client.form(Locator::Css("form.login")).await.unwrap();
    login.set_by_name("token", "not-the-token").await.unwrap();
    login.submit().await.unwrap();
    b.wait_for_text("main", "not the access token").await;
    let login = b.client.form(Locator::Css("form.login")).await.unwrap();
    login.set_by_name("token", token).await.unwrap();
    login.submit().await.unwrap();
    assert_eq!(b.wait_for_text("h1", "Queues").await, "Queues");
    b.client.goto(&format!("{base}/")).await.unwrap();
    assert_eq!(b.text("h1").await, "Queues", "the cookie keeps the browser in");
    b.close().await;

    // The login's cookie is HttpOnly and SameSite=Strict (sessions.rs tests the rest).
    let logged = crate::http::login(&base, token).await;
    assert!(
        logged.set_cookie.contains("HttpOnly") && logged.set_cookie.contains("SameSite=Strict"),
        "{}",
        logged.set_cookie
    );
    assert_eq!(
        http("GET", &format!("{base}/"), &[("cookie", &logged.cookie)], None)
            .await
            .status,
        200
    );

    // Without a token: loopback names only.
    let open = serve(over(&admin)).await;
    assert_eq!(http("GET", &format!("{open}/"), &[], None).await.status, 200);
    assert_eq!(
        http("GET", &format!("{open}/"), &[("host", "console.example:80")], None)
            .await
            .status,
        403
    );
}

/// `courier serve` refuses a non-loopback address without a token, saying what to do.
#[tokio::test]
async fn serve_refuses_a_public_address_without_a_token() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("app.db");
    Embedded::open(&file).await.unwrap().close().await;
    let out = Command::new(env!("CARGO_BIN_EXE_courier"))
        .args(["serve", "--listen", "0.0.0.0:0", "--embedded"])
        .arg(&file)
        .env_remove("COURIER_CONSOLE_TOKEN")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("--token") && stderr.contains("COURIER_CONSOLE_TOKEN"),
        "{stderr}"
    );
}

/// (e) `courier serve` with a store URL that carries a password never shows it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_never_shows_a_connection_password() {
    let db = courier::test_servers::postgres_database().await.unwrap();
    // The test server's URL, with a password in it (the server trusts, or this is its own).
    let url = db.url();
    let (url, password) = match url.split_once("://").and_then(|(_, rest)| rest.split_once('@')) {
        Some((user_info, _)) if user_info.contains(':') => {
            let password = user_info.split_once(':').unwrap().1.to_owned();
            (url.clone(), password)
        }
        _ => (
            url.replacen("://postgres@", "://postgres:console-s3cret-pw@", 1),
            "console-s3cret-pw".to_owned(),
        ),
    };
    assert!(url.contains(&format!(":{password}@")), "a password in {url}");
    courier::PostgresStore::connect(&url).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("app.db");
    Embedded::open(&file).await.unwrap().close().await;
    let mut child = Command::new(env!("CARGO_BIN_EXE_courier"))
        .args(["serve", "--listen", "127.0.0.1:0", "--embedded"])
        .arg(&file)
        .env("COURIER_POSTGRES", &url)
        .env_remove("COURIER_CONSOLE_TOKEN")
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let first = tokio::task::spawn_blocking(move || {
        use std::io::BufRead;
        let mut reader = std::io::BufReader::new(stderr);
        let mut line = String::new();
        reader.read_line(&mut line).unwrap();
        // Keep reading: the command writes more lines (what it holds of the file), and a
        // closed pipe would make its next line fail and the command stop.
        std::thread::spawn(move || std::io::copy(&mut reader, &mut std::io::sink()));
        line
    })
    .await
    .unwrap();
    let base = first
        .split_whitespace()
        .find(|w| w.starts_with("http://"))
        .unwrap_or_else(|| panic!("no address in {first:?}"))
        .trim_end_matches('/')
        .to_owned();
    assert!(!first.contains(&password), "{first}");
    let pages = [
        "/",
        "/sagas",
        "/sagas/list?saga=none",
        "/sagas/instance?saga=none&correlation=x",
        "/timeouts",
        "/outbox",
    ];
    let mut shown = String::new();
    for p in pages {
        let a = http("GET", &format!("{base}{p}"), &[], None).await;
        assert!(
            !a.body.contains(&format!(":{password}@")),
            "{p} shows the password: {}",
            a.body
        );
        shown.push_str(&a.body);
    }
    assert!(shown.contains(":***@"), "the store is named, its password hidden");
    child.kill().unwrap();
    child.wait().unwrap();
    db.drop_database().await.unwrap();
}

/// Without a token the router answers only a peer on loopback: one it cannot identify
/// (served without `ConnectInfo`) or another address gets 403, even with `Host:
/// localhost` (which any client can send).
#[tokio::test]
async fn without_a_token_only_a_loopback_peer_is_answered() {
    use axum::extract::ConnectInfo;
    use tower::ServiceExt;

    let (_dir, broker) = broker_file(Arc::new(courier::SystemClock)).await;
    let admin = EmbeddedAdmin::new(broker.clone());
    let router = over(&admin).router().unwrap();
    let ask = |peer: Option<[u8; 4]>| {
        let router = router.clone();
        async move {
            let mut request = axum::http::Request::builder()
                .uri("/")
                .header("host", "localhost:8080")
                .body(axum::body::Body::empty())
                .unwrap();
            if let Some(ip) = peer {
                request
                    .extensions_mut()
                    .insert(ConnectInfo(std::net::SocketAddr::from((ip, 40000))));
            }
            router.oneshot(request).await.unwrap().status().as_u16()
        }
    };
    assert_eq!(ask(Some([127, 0, 0, 1])).await, 200);
    assert_eq!(ask(Some([10, 0, 0, 5])).await, 403);
    assert_eq!(ask(None).await, 403, "a peer it cannot identify");
    broker.close().await;
}
