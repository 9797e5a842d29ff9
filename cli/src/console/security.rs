//! The checks every request passes before a page handler sees it ([`guard`]), the login
//! form, and logout.
//!
//! - Without an access token, only requests from a loopback address (the peer's address,
//!   which the server must provide: [`Console::serve`](super::Console::serve) does, a
//!   router served otherwise needs `into_make_service_with_connect_info::<SocketAddr>()`)
//!   and addressed to a loopback name (`Host: localhost`, `127.0.0.1`, `[::1]`, any port)
//!   are answered, others get 403: a console served on another address by mistake
//!   refuses everyone else, and a web page of another site cannot read it through DNS
//!   rebinding. (Behind a reverse proxy on the same machine every request comes from
//!   loopback: give such a console a token.) Every form carries the process's CSRF token.
//! - With a token, every request but the login form's must carry the cookie of an open
//!   session (`session.rs`: one per login, with its own CSRF token, ended by logout,
//!   idleness or age; the cookie is `HttpOnly`, `SameSite=Strict`, and `Secure` when the
//!   request came over HTTPS) or `Authorization: Bearer TOKEN` (scripts: their forms carry
//!   the process's CSRF token, which no session's page shows); else 401 with the login
//!   form. The login form shows no token usable for a change: its hidden field repeats a
//!   random value of a cookie of its own (kept while the browser has it, so the form of
//!   another tab still works), which the login's POST must match (a page of another site
//!   can neither read nor send that cookie).
//! - Every POST must carry the CSRF token of whoever sends it in the form field `csrf`
//!   (403 otherwise), and when the browser says where the form came from (`Origin`, else
//!   `Referer`), it must be this console's own origin (403 otherwise).
//! - Every response forbids scripts, framing and caching (`Content-Security-Policy`,
//!   `X-Frame-Options`, `Cache-Control: no-store`).

use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::{ConnectInfo, FromRequestParts, Request, State};
use axum::http::header::{
    AUTHORIZATION, CACHE_CONTROL, CONTENT_SECURITY_POLICY, COOKIE, HOST, ORIGIN, REFERER, REFERRER_POLICY, SET_COOKIE,
    WWW_AUTHENTICATE, X_CONTENT_TYPE_OPTIONS, X_FRAME_OPTIONS,
};
use axum::http::request::Parts;
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Redirect, Response};
use maud::html;
use subtle::ConstantTimeEq;

use super::layout::{self, PageError};
use super::session::{MAX_AGE, Sessions};
use super::{Shared, State as ConsoleState};

/// The session cookie's name.
const COOKIE_NAME: &str = "courier_console";

/// The login form's cookie: a random value its hidden field repeats.
const LOGIN_COOKIE: &str = "courier_console_login";

/// How long the login form's cookie lasts (a form older than this asks to log in again).
const LOGIN_COOKIE_SECONDS: i64 = 3600;

/// The largest form body accepted (a "selected" resubmit of a page of sequence numbers
/// is a few kilobytes).
const MAX_FORM: usize = 1 << 20;

/// What lets a request in when a token is configured.
pub(crate) struct Access {
    token: String,
    /// One per login.
    pub(crate) sessions: Sessions,
}

impl Access {
    pub(crate) fn new(token: String, sessions: Sessions) -> Self {
        Self { token, sessions }
    }

    /// Whether the request carries the bearer token.
    fn bearer(&self, headers: &HeaderMap) -> bool {
        headers
            .get(AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .is_some_and(|t| equal(t.trim(), &self.token))
    }

    /// Who the request comes from: a script with the bearer token, or an open session;
    /// `None` for anyone else.
    fn admit(&self, headers: &HeaderMap, process_csrf: &str) -> Option<Viewer> {
        if self.bearer(headers) {
            return Some(Viewer {
                csrf: process_csrf.to_owned(),
                session: None,
            });
        }
        let id = cookie(headers, COOKIE_NAME)?;
        let csrf = self.sessions.admit(&id)?;
        Some(Viewer {
            csrf,
            session: Some(id),
        })
    }
}

/// Who sent a request the guard let in: the CSRF token the forms of its pages carry (and
/// its POSTs must), and its session when it came with a login's cookie.
#[derive(Debug, Clone)]
pub(crate) struct Viewer {
    pub(crate) csrf: String,
    /// The session's id (its pages show "Log out").
    pub(crate) session: Option<String>,
}

impl<S: Send + Sync> FromRequestParts<S> for Viewer {
    type Rejection = PageError;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, PageError> {
        parts.extensions.get::<Viewer>().cloned().ok_or_else(|| {
            PageError::new(
                StatusCode::UNAUTHORIZED,
                "Not logged in",
                "This page needs a login: open the console's login page.",
            )
        })
    }
}

/// A random token: 244 bits from the operating system's generator (two UUIDv4).
pub(crate) fn random_token() -> String {
    format!("{}{}", uuid::Uuid::new_v4().simple(), uuid::Uuid::new_v4().simple())
}

/// Compares secrets in constant time (for equal lengths).
fn equal(a: &str, b: &str) -> bool {
    a.as_bytes().ct_eq(b.as_bytes()).into()
}

/// The value of the cookie `name`.
fn cookie(headers: &HeaderMap, name: &str) -> Option<String> {
    headers
        .get_all(COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v.to_owned())
}

/// Whether a `Host` header names a loopback address (any port).
fn is_loopback_host(host: &str) -> bool {
    let name = if let Some(rest) = host.strip_prefix('[') {
        rest.split_once(']').map_or(rest, |(ip, _)| ip)
    } else {
        host.rsplit_once(':').map_or(host, |(name, _)| name)
    };
    name.eq_ignore_ascii_case("localhost") || name.parse::<std::net::IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

/// The `host[:port]` of an origin or URL (`http://127.0.0.1:8080/dlq` → `127.0.0.1:8080`).
fn authority(url: &str) -> Option<&str> {
    let rest = url.split_once("://")?.1;
    Some(rest.split(['/', '?', '#']).next().unwrap_or(rest))
}

/// Whether a browser's POST comes from a page of this console: its `Origin` (else its
/// `Referer`) names the host the request is addressed to. A client that sends neither
/// (a script with curl) passes; the CSRF token is still required.
fn same_origin(headers: &HeaderMap, host: &str) -> bool {
    let from = headers
        .get(ORIGIN)
        .or_else(|| headers.get(REFERER))
        .and_then(|v| v.to_str().ok());
    match from {
        None => true,
        Some(from) => authority(from).is_some_and(|a| a.eq_ignore_ascii_case(host)),
    }
}

/// Whether a form body carries the CSRF token.
fn has_csrf(body: &[u8], csrf: &str) -> bool {
    serde_urlencoded::from_bytes::<Vec<(String, String)>>(body)
        .is_ok_and(|pairs| pairs.iter().any(|(k, v)| k == "csrf" && equal(v, csrf)))
}

/// Whether the request came over HTTPS (a TLS proxy says so with `X-Forwarded-Proto`, a
/// browser's form with its `Origin` or `Referer`): the cookies set then are `Secure`.
fn over_https(headers: &HeaderMap) -> bool {
    let says_https = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.trim().to_ascii_lowercase().starts_with("https"))
    };
    says_https("x-forwarded-proto") || says_https(ORIGIN.as_str()) || says_https(REFERER.as_str())
}

/// A `Set-Cookie` value: always `HttpOnly` and `SameSite=Strict`.
fn set_cookie(name: &str, value: &str, path: &str, max_age: i64, secure: bool) -> Option<HeaderValue> {
    let secure = if secure { "; Secure" } else { "" };
    HeaderValue::from_str(&format!(
        "{name}={value}; HttpOnly; SameSite=Strict; Path={path}; Max-Age={max_age}{secure}"
    ))
    .ok()
}

/// Every request goes through here: host, access token or session, CSRF and origin,
/// then the security headers on the response.
pub(crate) async fn guard(State(state): State<Arc<ConsoleState>>, request: Request, next: Next) -> Response {
    let mut response = match check(&state, request).await {
        Ok(request) => next.run(request).await,
        Err(refused) => refused,
    };
    let headers = response.headers_mut();
    headers.insert(
        CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(
            "default-src 'none'; style-src 'unsafe-inline'; img-src 'self' data:; form-action 'self'; \
             frame-ancestors 'none'; base-uri 'none'",
        ),
    );
    headers.insert(X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    headers.insert(X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    headers.insert(REFERRER_POLICY, HeaderValue::from_static("same-origin"));
    headers.insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
    response
}

/// The request back, with its [`Viewer`] (and its body read and put back for a POST); or
/// the answer instead (a refusal, or the login form).
async fn check(state: &ConsoleState, mut request: Request) -> Result<Request, Response> {
    let host = request
        .headers()
        .get(HOST)
        .and_then(|h| h.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    let peer = request.extensions().get::<ConnectInfo<SocketAddr>>().map(|c| c.0);
    if state.access.is_none() && !peer.is_some_and(|p| p.ip().is_loopback()) {
        let who = peer.map_or_else(|| "an unknown address".to_owned(), |p| p.ip().to_string());
        return Err(PageError::new(
            StatusCode::FORBIDDEN,
            "Not from loopback",
            format!(
                "This console has no access token, so it answers only requests from this machine (loopback), and \
                 this one comes from {who}. Start it with a token (--token or COURIER_CONSOLE_TOKEN) to open it \
                 from elsewhere. (An application that serves Console::router itself must serve it with \
                 into_make_service_with_connect_info::<SocketAddr>(), or give a token.)"
            ),
        )
        .into_response());
    }
    if state.access.is_none() && !is_loopback_host(&host) {
        return Err(PageError::new(
            StatusCode::FORBIDDEN,
            "Not on loopback",
            format!(
                "This console has no access token, so it answers only requests addressed to a loopback name \
                 (localhost, 127.0.0.1, [::1]), and this one is addressed to \"{host}\". Open it on \
                 http://127.0.0.1:PORT/, or start it with a token (--token or COURIER_CONSOLE_TOKEN) to serve it on \
                 other addresses."
            ),
        )
        .into_response());
    }
    let viewer = match &state.access {
        None => Some(Viewer {
            csrf: state.csrf.clone(),
            session: None,
        }),
        Some(access) => access.admit(request.headers(), &state.csrf),
    };
    // The login form is the one page for those not admitted; its POST carries the login
    // cookie's value instead of a session's CSRF token.
    let login = state.access.is_some() && request.uri().path() == "/login";
    if viewer.is_none() && !login {
        return Err(unauthorized(state, request.headers(), None));
    }
    if let Some(v) = &viewer {
        request.extensions_mut().insert(v.clone());
    }
    if request.method() != Method::POST {
        return Ok(request);
    }
    if !same_origin(request.headers(), &host) {
        return Err(PageError::new(
            StatusCode::FORBIDDEN,
            "Refused: another site's form",
            "This change was sent by a page that is not this console's (its Origin or Referer names another \
             host). Nothing was changed. Make changes from the console's own pages.",
        )
        .into_response());
    }
    let (parts, body) = request.into_parts();
    let Ok(bytes) = axum::body::to_bytes(body, MAX_FORM).await else {
        return Err(PageError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "Form too large",
            "The form sent is larger than a console form can be. Nothing was changed; select fewer messages, or \
             use \"all\".",
        )
        .into_response());
    };
    let expected = if login {
        // Without the cookie, nothing can match.
        cookie(&parts.headers, LOGIN_COOKIE).filter(|c| !c.is_empty())
    } else {
        viewer.map(|v| v.csrf)
    };
    if !expected.is_some_and(|csrf| has_csrf(&bytes, &csrf)) {
        if login {
            return Err(unauthorized(
                state,
                &parts.headers,
                Some("The login form had expired or was not this console's: log in again."),
            ));
        }
        return Err(PageError::new(
            StatusCode::FORBIDDEN,
            "Refused: the form's CSRF token is missing or wrong",
            "Every change must be sent from a form of this console, which carries the token of your session. \
             Nothing was changed. You may have logged out or in again, or the console may have restarted, since \
             the page was loaded: reload the page and try again.",
        )
        .into_response());
    }
    Ok(Request::from_parts(parts, axum::body::Body::from(bytes)))
}

/// 401 with the login form, and the cookie its hidden field repeats (a random value, the
/// browser's own when it has one: nothing in the page can make a change).
fn unauthorized(state: &ConsoleState, request: &HeaderMap, message: Option<&str>) -> Response {
    // The value the browser has already, if any: another answer (its icon's, another
    // tab's) must not replace the one of the form on the screen.
    let nonce = cookie(request, LOGIN_COOKIE)
        .filter(|c| c.len() == 64 && c.bytes().all(|b| b.is_ascii_hexdigit()))
        .unwrap_or_else(random_token);
    let body = html! {
        h1 { "Log in" }
        @if let Some(m) = message { p.flash.bad { (m) } }
        p { "This console needs its access token (given to " code { "courier serve" } " with "
            code { "--token" } " or " code { "COURIER_CONSOLE_TOKEN" } "). Scripts can send it as "
            code { "Authorization: Bearer TOKEN" } " instead." }
        form.login method="post" action="/login" {
            input type="hidden" name="csrf" value=(nonce);
            label { "Access token " input type="password" name="token" autocomplete="current-password" required autofocus; }
            " "
            button type="submit" { "Log in" }
        }
    };
    let mut response = (
        StatusCode::UNAUTHORIZED,
        layout::frame("Log in", None, state.read_only_note().as_deref(), &body),
    )
        .into_response();
    let headers = response.headers_mut();
    headers.insert(
        WWW_AUTHENTICATE,
        HeaderValue::from_static("Bearer realm=\"courier console\""),
    );
    if let Some(v) = set_cookie(LOGIN_COOKIE, &nonce, "/", LOGIN_COOKIE_SECONDS, over_https(request)) {
        headers.append(SET_COOKIE, v);
    }
    response
}

/// `GET /login`: the form (or the dashboard when no token is needed or already logged in).
pub(crate) async fn login_page(
    State(state): Shared,
    viewer: Option<axum::Extension<Viewer>>,
    headers: HeaderMap,
) -> Response {
    if state.access.is_none() || viewer.is_some() {
        return Redirect::to("/").into_response();
    }
    let mut r = unauthorized(&state, &headers, None);
    *r.status_mut() = StatusCode::OK;
    r
}

/// `POST /login` (its form's cookie checked by the guard): checks the token and opens a
/// session.
pub(crate) async fn login(
    State(state): Shared,
    headers: HeaderMap,
    form: axum::Form<Vec<(String, String)>>,
) -> Response {
    let Some(access) = &state.access else {
        return Redirect::to("/").into_response();
    };
    let given = form.0.iter().find(|(k, _)| k == "token").map(|(_, v)| v.trim());
    if !given.is_some_and(|t| equal(t, &access.token)) {
        return unauthorized(&state, &headers, Some("That is not the access token: try again."));
    }
    let opened = access.sessions.open();
    let secure = over_https(&headers);
    let mut response = Redirect::to("/").into_response();
    let cookies = [
        set_cookie(COOKIE_NAME, &opened.id, "/", MAX_AGE.num_seconds(), secure),
        set_cookie(LOGIN_COOKIE, "", "/", 0, secure),
    ];
    for v in cookies.into_iter().flatten() {
        response.headers_mut().append(SET_COOKIE, v);
    }
    response
}

/// `POST /logout`: ends the session on the server (its cookie is refused afterwards) and
/// clears the cookie.
pub(crate) async fn logout(State(state): Shared, viewer: Viewer, headers: HeaderMap) -> Response {
    if let (Some(access), Some(id)) = (&state.access, &viewer.session) {
        access.sessions.end(id);
    }
    let mut response = Redirect::to("/login").into_response();
    if let Some(v) = set_cookie(COOKIE_NAME, "", "/", 0, over_https(&headers)) {
        response.headers_mut().insert(SET_COOKIE, v);
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_names_are_recognised_with_and_without_a_port() {
        for host in [
            "localhost",
            "localhost:8080",
            "127.0.0.1:80",
            "127.1.2.3",
            "[::1]:8080",
            "[::1]",
            "LOCALHOST",
        ] {
            assert!(is_loopback_host(host), "{host}");
        }
        for host in [
            "",
            "example.com",
            "10.0.0.5:8080",
            "[fe80::1]:80",
            "localhost.evil.com",
            "127.0.0.1.nip.io",
        ] {
            assert!(!is_loopback_host(host), "{host}");
        }
    }

    #[test]
    fn a_post_from_another_origin_is_not_the_consoles() {
        let mut h = HeaderMap::new();
        assert!(same_origin(&h, "127.0.0.1:8080"), "no Origin: a script");
        h.insert(ORIGIN, HeaderValue::from_static("http://127.0.0.1:8080"));
        assert!(same_origin(&h, "127.0.0.1:8080"));
        assert!(!same_origin(&h, "localhost:8080"));
        h.insert(ORIGIN, HeaderValue::from_static("null"));
        assert!(!same_origin(&h, "127.0.0.1:8080"));
        let mut r = HeaderMap::new();
        r.insert(REFERER, HeaderValue::from_static("https://evil.example/x?y"));
        assert!(!same_origin(&r, "127.0.0.1:8080"));
    }

    #[test]
    fn the_csrf_field_and_the_cookie_are_found() {
        assert!(has_csrf(b"queue=a&csrf=abc&seq=1", "abc"));
        assert!(!has_csrf(b"queue=a&csrf=abd", "abc"));
        assert!(!has_csrf(b"queue=a", "abc"));
        let mut h = HeaderMap::new();
        h.insert(COOKIE, HeaderValue::from_static("a=1; courier_console=s3; b=2"));
        assert_eq!(cookie(&h, COOKIE_NAME).as_deref(), Some("s3"));
        let access = Access::new(
            "token-token-token".into(),
            Sessions::new(Arc::new(courier::SystemClock)),
        );
        assert!(access.admit(&h, "process").is_none(), "no such session");
        h.insert(AUTHORIZATION, HeaderValue::from_static("Bearer token-token-token"));
        assert_eq!(
            access.admit(&h, "process").map(|v| (v.csrf, v.session)),
            Some(("process".to_owned(), None)),
            "a script with the bearer token"
        );
        let opened = access.sessions.open();
        let mut s = HeaderMap::new();
        s.insert(
            COOKIE,
            HeaderValue::from_str(&format!("courier_console={}", opened.id)).unwrap_or(HeaderValue::from_static("")),
        );
        assert_eq!(
            access.admit(&s, "process").map(|v| (v.csrf, v.session)),
            Some((opened.csrf, Some(opened.id))),
            "a session, with its own CSRF token"
        );
    }
}
