//! A plain HTTP client, for what a browser would not send (no CSRF token, a foreign
//! origin, no access token), and readers of the pages it gets.

use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::connect::HttpConnector;

pub(crate) struct Answer {
    pub(crate) status: u16,
    pub(crate) headers: hyper::HeaderMap,
    pub(crate) body: String,
}

pub(crate) async fn http(method: &str, url: &str, headers: &[(&str, &str)], form: Option<&str>) -> Answer {
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build::<_, Full<bytes::Bytes>>(HttpConnector::new());
    let mut request = hyper::Request::builder().method(method).uri(url);
    for (k, v) in headers {
        request = request.header(*k, *v);
    }
    if form.is_some() {
        request = request.header("content-type", "application/x-www-form-urlencoded");
    }
    let body = Full::new(bytes::Bytes::from(form.unwrap_or_default().to_owned()));
    let response = client.request(request.body(body).unwrap()).await.unwrap();
    let status = response.status().as_u16();
    let headers = response.headers().clone();
    let body = response.into_body().collect().await.unwrap().to_bytes();
    Answer {
        status,
        headers,
        body: String::from_utf8_lossy(&body).into_owned(),
    }
}

/// How many points the sparkline of `queue` has on a dashboard page.
pub(crate) fn sparkline_points(page: &str, queue: &str) -> usize {
    let Some(row) = page.split(&format!("data-queue=\"{queue}\"")).nth(1) else {
        return 0;
    };
    let row = row.split("</tr>").next().unwrap_or_default();
    row.split("<polyline points=\"")
        .nth(1)
        .and_then(|p| p.split('"').next())
        .map_or(0, |p| p.split(' ').count())
}

/// The CSRF token of a page's forms.
pub(crate) fn csrf_of(page: &str) -> String {
    let at = page.find("name=\"csrf\" value=\"").expect("a form with the CSRF token") + 19;
    page[at..].split('"').next().unwrap().to_owned()
}

/// The `name=value` of the cookie `name` an answer sets.
pub(crate) fn set_cookie(answer: &Answer, name: &str) -> Option<String> {
    answer
        .headers
        .get_all("set-cookie")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .find(|v| v.starts_with(&format!("{name}=")))
        .map(str::to_owned)
}

/// The whole `Set-Cookie` of the session cookie, and its `courier_console=ID` part.
pub(crate) struct Login {
    pub(crate) set_cookie: String,
    pub(crate) cookie: String,
}

/// Logs in as a browser does: the login form (its cookie and hidden field), then its POST
/// with the token.
pub(crate) async fn login(base: &str, token: &str) -> Login {
    let form = http("GET", &format!("{base}/login"), &[], None).await;
    assert_eq!(form.status, 200, "{}", form.body);
    let nonce = csrf_of(&form.body);
    let login_cookie = set_cookie(&form, "courier_console_login").expect("the login form's cookie");
    let login_cookie = login_cookie.split(';').next().unwrap().to_owned();
    let done = http(
        "POST",
        &format!("{base}/login"),
        &[("cookie", &login_cookie)],
        Some(&format!("csrf={nonce}&token={token}")),
    )
    .await;
    assert_eq!(done.status, 303, "{}", done.body);
    let set_cookie = set_cookie(&done, "courier_console").expect("a session cookie");
    let cookie = set_cookie.split(';').next().unwrap().to_owned();
    Login { set_cookie, cookie }
}
