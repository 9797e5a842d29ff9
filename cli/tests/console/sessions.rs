//! Login sessions of a console with an access token (issue 31, point 10): each login its
//! own cookie and CSRF token, logout ends the session on the server, sessions expire on
//! the console's clock, and the login form shows nothing usable for a change.

use std::sync::Arc;
use std::time::Duration;

use courier::VirtualClock;
use courier::admin::{EmbeddedAdmin, QueueAdmin};

use crate::fixture::*;
use crate::http::{Login, csrf_of, http, login};

const TOKEN: &str = "console-session-token-0123456789";

/// A console with a token over a file with one dead letter in `orders`; its base URL, the
/// admin, and the dead letter's sequence number.
async fn console(
    clock: Arc<dyn courier::Clock>,
) -> (tempfile::TempDir, EmbeddedAdmin, String, courier::SequenceNumber) {
    let (dir, broker) = broker_file(Arc::new(courier::SystemClock)).await;
    let admin = EmbeddedAdmin::new(broker.clone());
    dead_letter(&broker, "orders", "{}", "shop.PlaceOrder", "test.Poison").await;
    let seq = admin.all_dead_letters("orders").await.unwrap()[0];
    let base = serve(over(&admin).token(TOKEN).clock(clock)).await;
    (dir, admin, base, seq)
}

/// The CSRF token on the dead-letter page a session sees.
async fn csrf_of_session(base: &str, session: &Login) -> String {
    let page = http(
        "GET",
        &format!("{base}/dlq?queue=orders"),
        &[("cookie", &session.cookie)],
        None,
    )
    .await;
    assert_eq!(page.status, 200, "{}", page.body);
    csrf_of(&page.body)
}

/// Two logins get two sessions: different cookies and different CSRF tokens; the token of
/// session A is refused with the cookie of session B (nothing changes), B's own is taken.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_login_has_its_own_session_and_csrf_token() {
    let (_dir, admin, base, seq) = console(Arc::new(courier::SystemClock)).await;
    let a = login(&base, TOKEN).await;
    let b = login(&base, TOKEN).await;
    assert_ne!(a.cookie, b.cookie, "two logins, two cookies");
    for s in [&a, &b] {
        assert!(
            s.set_cookie.contains("HttpOnly") && s.set_cookie.contains("SameSite=Strict"),
            "{}",
            s.set_cookie
        );
        assert!(
            s.set_cookie.contains("Max-Age=43200"),
            "ends after 12 h: {}",
            s.set_cookie
        );
        assert!(!s.set_cookie.contains("Secure"), "plain HTTP: {}", s.set_cookie);
    }
    let csrf_a = csrf_of_session(&base, &a).await;
    let csrf_b = csrf_of_session(&base, &b).await;
    assert_ne!(csrf_a, csrf_b, "each session its own CSRF token");

    let delete = |cookie: String, csrf: String| {
        let base = base.clone();
        async move {
            http(
                "POST",
                &format!("{base}/dlq/delete"),
                &[("cookie", &cookie)],
                Some(&format!("queue=orders&one={seq}&confirmed=1&csrf={csrf}")),
            )
            .await
        }
    };
    let crossed = delete(b.cookie.clone(), csrf_a.clone()).await;
    assert_eq!(crossed.status, 403, "A's token with B's cookie: {}", crossed.body);
    assert_eq!(dead_count(&admin, "orders").await, 1, "nothing was deleted");
    let own = delete(b.cookie.clone(), csrf_b).await;
    assert_eq!(own.status, 303, "{}", own.body);
    assert_eq!(dead_count(&admin, "orders").await, 0);

    // Behind a TLS proxy the cookie is Secure.
    let form = http("GET", &format!("{base}/login"), &[("x-forwarded-proto", "https")], None).await;
    let nonce_cookie = crate::http::set_cookie(&form, "courier_console_login").unwrap();
    assert!(nonce_cookie.contains("Secure"), "{nonce_cookie}");
    let done = http(
        "POST",
        &format!("{base}/login"),
        &[
            ("cookie", nonce_cookie.split(';').next().unwrap()),
            ("x-forwarded-proto", "https"),
        ],
        Some(&format!("csrf={}&token={TOKEN}", csrf_of(&form.body))),
    )
    .await;
    let secure = crate::http::set_cookie(&done, "courier_console").unwrap();
    assert!(secure.contains("; Secure"), "{secure}");
}

/// Logout ends the session on the server: the old cookie is refused afterwards (401 with
/// the login form), while another session stays open.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_logout_the_cookie_is_refused() {
    let (_dir, _admin, base, _seq) = console(Arc::new(courier::SystemClock)).await;
    let a = login(&base, TOKEN).await;
    let b = login(&base, TOKEN).await;
    let csrf = csrf_of_session(&base, &a).await;
    let out = http(
        "POST",
        &format!("{base}/logout"),
        &[("cookie", &a.cookie)],
        Some(&format!("csrf={csrf}")),
    )
    .await;
    assert_eq!(out.status, 303, "{}", out.body);
    let cleared = crate::http::set_cookie(&out, "courier_console").unwrap();
    assert!(cleared.contains("Max-Age=0"), "{cleared}");
    // The browser would forget it; someone who kept it is refused all the same.
    let again = http("GET", &format!("{base}/"), &[("cookie", &a.cookie)], None).await;
    assert_eq!(again.status, 401, "the old cookie after logout");
    assert!(again.body.contains("name=\"token\""), "the login form");
    let other = http("GET", &format!("{base}/"), &[("cookie", &b.cookie)], None).await;
    assert_eq!(other.status, 200, "the other session is still open");
}

/// A session ends 2 h after its last request, and 12 h after its login however busy, on
/// the console's clock (driven here, no waiting).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_session_is_refused() {
    let clock = VirtualClock::starting_now();
    let (_dir, _admin, base, _seq) = console(Arc::new(clock.clone())).await;
    let get = |cookie: String| {
        let base = base.clone();
        async move {
            http("GET", &format!("{base}/"), &[("cookie", &cookie)], None)
                .await
                .status
        }
    };
    let idle = login(&base, TOKEN).await;
    let busy = login(&base, TOKEN).await;
    clock.advance(Duration::from_secs(2 * 3600 - 1));
    assert_eq!(get(idle.cookie.clone()).await, 200, "idle for just under 2 h");
    assert_eq!(get(busy.cookie.clone()).await, 200);
    clock.advance(Duration::from_secs(3600));
    assert_eq!(get(busy.cookie.clone()).await, 200);
    clock.advance(Duration::from_secs(3600));
    assert_eq!(get(idle.cookie.clone()).await, 401, "idle for 2 h");
    assert_eq!(get(busy.cookie.clone()).await, 200, "used 1 h ago");
    for _ in 0..5 {
        clock.advance(Duration::from_secs(3600 + 1800));
        assert_eq!(get(busy.cookie.clone()).await, 200, "used every 1.5 h");
    }
    // 4 h - 1 s + 5 × 1.5 h: 11 h 29 m 59 s after its login.
    clock.advance(Duration::from_secs(1801));
    assert_eq!(
        get(busy.cookie.clone()).await,
        401,
        "12 h after its login, used 30 min ago"
    );
    assert_eq!(get(login(&base, TOKEN).await.cookie).await, 200, "a new login works");
}

/// The login form, shown to anyone, carries no token that makes a change: its hidden
/// value is refused as the CSRF token of a session and of a script with the bearer token;
/// and a login needs the form's cookie (a forged login form of another site is refused).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_login_page_reveals_no_token_usable_for_a_change() {
    let (_dir, admin, base, seq) = console(Arc::new(courier::SystemClock)).await;
    let anonymous = http("GET", &format!("{base}/dlq?queue=orders"), &[], None).await;
    assert_eq!(anonymous.status, 401);
    let login_page = http("GET", &format!("{base}/login"), &[], None).await;
    let shown: Vec<String> = [&anonymous.body, &login_page.body]
        .iter()
        .map(|body| csrf_of(body))
        .collect();
    assert_ne!(shown[0], shown[1], "a new value each time");

    let session = login(&base, TOKEN).await;
    let bearer = format!("Bearer {TOKEN}");
    let change = |csrf: &str| format!("queue=orders&one={seq}&confirmed=1&csrf={csrf}");
    for csrf in &shown {
        let as_session = http(
            "POST",
            &format!("{base}/dlq/delete"),
            &[("cookie", &session.cookie)],
            Some(&change(csrf)),
        )
        .await;
        assert_eq!(as_session.status, 403, "the login form's value as a session's token");
        let as_script = http(
            "POST",
            &format!("{base}/dlq/delete"),
            &[("authorization", &bearer)],
            Some(&change(csrf)),
        )
        .await;
        assert_eq!(as_script.status, 403, "the login form's value with the bearer token");
    }
    assert_eq!(dead_count(&admin, "orders").await, 1, "nothing was deleted");
    assert!(
        !login_page.body.contains(&csrf_of_session(&base, &session).await),
        "the session's token is not on the login form"
    );

    // A login without the form's cookie (another site's form) opens no session.
    let forged = http(
        "POST",
        &format!("{base}/login"),
        &[],
        Some(&format!("csrf={}&token={TOKEN}", shown[1])),
    )
    .await;
    assert_eq!(forged.status, 401, "{}", forged.body);
    assert!(crate::http::set_cookie(&forged, "courier_console").is_none());
}
