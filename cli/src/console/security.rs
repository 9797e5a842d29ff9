//! The checks every request passes before a page handler sees it ([`guard`]), and the
//! login form.
//!
//! - Without an access token, only requests from a loopback address (the peer's address,
//!   which the server must provide: [`Console::serve`](super::Console::serve) does, a
//!   router served otherwise needs `into_make_service_with_connect_info::<SocketAddr>()`)
//!   and addressed to a loopback name (`Host: localhost`, `127.0.0.1`, `[::1]`, any port)
//!   are answered, others get 403: a console served on another address by mistake
//!   refuses everyone else, and a web page of another site cannot read it through DNS
//!   rebinding. (Behind a reverse proxy on the same machine every request comes from
//!   loopback: give such a console a token.)
//! - With a token, every request but the login form's must carry the session cookie the
//!   login sets (`HttpOnly`, `SameSite=Strict`; a random value per process, so restarting
//!   the console logs everyone out) or `Authorization: Bearer TOKEN`; else 401 with the
//!   login form.
//! - Every POST must carry the process's CSRF token in the form field `csrf` (403
//!   otherwise), and when the browser says where the form came from (`Origin`, else
//!   `Referer`), it must be this console's own origin (403 otherwise).
//! - Every response forbids scripts, framing and caching (`Content-Security-Policy`,
//!   `X-Frame-Options`, `Cache-Control: no-store`).

use std::sync::Arc;

use std::net::SocketAddr;

use axum::extract::{ConnectInfo, Request, State};
use axum::http::header::{
    AUTHORIZATION, CACHE_CONTROL, CONTENT_SECURITY_POLICY, COOKIE, HOST, ORIGIN, REFERER, REFERRER_POLICY, SET_COOKIE,
    WWW_AUTHENTICATE, X_CONTENT_TYPE_OPTIONS, X_FRAME_OPTIONS,
};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Redirect, Response};
use maud::html;
use subtle::ConstantTimeEq;

use super::layout::{self, PageError};
use super::{Shared, State as ConsoleState};

/// The session cookie's name.
const COOKIE_NAME: &str = "courier_console";

/// The largest form body accepted (a "selected" resubmit of a page of sequence numbers
/// is a few kilobytes).
const MAX_FORM: usize = 1 << 20;

/// What lets a request in when a token is configured.
pub(crate) struct Access {
    token: String,
    /// The cookie's value after a login: random per process.
    session: String,
}

impl Access {
    pub(crate) fn new(token: String) -> Self {
        Self {
            token,
            session: random_token(),
        }
    }

    /// Whether the request carries the session cookie or the bearer token.
    fn admits(&self, headers: &HeaderMap) -> bool {
        let bearer = headers
            .get(AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .is_some_and(|t| equal(t.trim(), &self.token));
        bearer || cookie(headers, COOKIE_NAME).is_some_and(|c| equal(&c, &self.session))
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

/// Every request goes through here: host, access token, CSRF and origin, then the
/// security headers on the response.
pub(crate) async fn guard(State(state): State<Arc<ConsoleState>>, request: Request, next: Next) -> Response {
    let mut response = match check(&state, request).await {
        Ok((request, admitted)) => {
            if admitted {
                next.run(request).await
            } else {
                unauthorized(&state, None)
            }
        }
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

/// The request back (its body read and put back for a POST) and whether it is admitted
/// (`false`: answer with the login form); or the refusal.
async fn check(state: &ConsoleState, request: Request) -> Result<(Request, bool), Response> {
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
    let admitted = match &state.access {
        Some(access) => request.uri().path() == "/login" || access.admits(request.headers()),
        None => true,
    };
    if !admitted || request.method() != Method::POST {
        return Ok((request, admitted));
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
    if !has_csrf(&bytes, &state.csrf) {
        return Err(PageError::new(
            StatusCode::FORBIDDEN,
            "Refused: the form's CSRF token is missing or wrong",
            "Every change must be sent from a form of this console, which carries its token. Nothing was \
             changed. The console may have restarted since the page was loaded: reload the page and try again.",
        )
        .into_response());
    }
    Ok((Request::from_parts(parts, axum::body::Body::from(bytes)), true))
}

/// 401 with the login form.
fn unauthorized(state: &ConsoleState, message: Option<&str>) -> Response {
    let body = html! {
        h1 { "Log in" }
        @if let Some(m) = message { p.flash.bad { (m) } }
        p { "This console needs its access token (given to " code { "courier serve" } " with "
            code { "--token" } " or " code { "COURIER_CONSOLE_TOKEN" } "). Scripts can send it as "
            code { "Authorization: Bearer TOKEN" } " instead." }
        form.login method="post" action="/login" {
            input type="hidden" name="csrf" value=(state.csrf);
            label { "Access token " input type="password" name="token" autocomplete="current-password" required autofocus; }
            " "
            button type="submit" { "Log in" }
        }
    };
    let mut response = (StatusCode::UNAUTHORIZED, layout::frame("Log in", None, &body)).into_response();
    response.headers_mut().insert(
        WWW_AUTHENTICATE,
        HeaderValue::from_static("Bearer realm=\"courier console\""),
    );
    response
}

/// `GET /login`: the form (or the dashboard when no token is needed or already logged in).
pub(crate) async fn login_page(State(state): Shared, headers: HeaderMap) -> Response {
    match &state.access {
        Some(access) if !access.admits(&headers) => {
            let mut r = unauthorized(&state, None);
            *r.status_mut() = StatusCode::OK;
            r
        }
        _ => Redirect::to("/").into_response(),
    }
}

/// `POST /login`: checks the token and sets the session cookie.
pub(crate) async fn login(State(state): Shared, form: axum::Form<Vec<(String, String)>>) -> Response {
    let Some(access) = &state.access else {
        return Redirect::to("/").into_response();
    };
    let given = form.0.iter().find(|(k, _)| k == "token").map(|(_, v)| v.trim());
    if !given.is_some_and(|t| equal(t, &access.token)) {
        return unauthorized(&state, Some("That is not the access token: try again."));
    }
    let cookie = format!("{COOKIE_NAME}={}; HttpOnly; SameSite=Strict; Path=/", access.session);
    let mut response = Redirect::to("/").into_response();
    if let Ok(v) = HeaderValue::from_str(&cookie) {
        response.headers_mut().insert(SET_COOKIE, v);
    }
    response
}

/// `POST /logout`: forgets the session cookie.
pub(crate) async fn logout() -> Response {
    let mut response = Redirect::to("/login").into_response();
    response.headers_mut().insert(
        SET_COOKIE,
        HeaderValue::from_static("courier_console=; HttpOnly; SameSite=Strict; Path=/; Max-Age=0"),
    );
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
        let access = Access::new("token-token-token".into());
        assert!(!access.admits(&h));
        h.insert(AUTHORIZATION, HeaderValue::from_static("Bearer token-token-token"));
        assert!(access.admits(&h));
    }
}
