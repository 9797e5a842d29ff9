//! The page frame (navigation, style), the formats every page shares (times, ages,
//! bodies), and error pages: an [`AdminError`] becomes a page with the HTTP status that
//! fits and a sentence saying what to do.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use chrono::{DateTime, Utc};
use courier::admin::AdminError;
use maud::{DOCTYPE, Markup, html};

pub(crate) use super::security::Viewer;

/// The style of every page: small, inline (the policy allows no other source).
const STYLE: &str = r#"
*{box-sizing:border-box}
body{margin:0;font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;color:#1f2328;background:#f6f8fa}
header{display:flex;align-items:center;gap:1.5em;padding:.6em 1.5em;background:#24292f;color:#fff}
header a{color:#d0d7de;text-decoration:none}header a:hover,header a.on{color:#fff}
header .brand{font-weight:600;color:#fff;margin-right:1em}
header form{margin-left:auto}
main{padding:1em 1.5em 3em;max-width:1400px}
h1{font-size:1.4em;margin:.4em 0 .6em;overflow-wrap:anywhere}h2{font-size:1.1em;margin:1.4em 0 .5em}
p.crumbs{overflow-wrap:anywhere}
a{color:#0969da}
table{border-collapse:collapse;background:#fff;border:1px solid #d0d7de;margin:.3em 0 1em}
th,td{padding:.35em .7em;border-bottom:1px solid #eaeef2;text-align:left;vertical-align:top}
td{overflow-wrap:break-word}td.err,td.wrap{overflow-wrap:anywhere}td.state{white-space:nowrap}
th{background:#f6f8fa;font-weight:600;font-size:.92em;white-space:nowrap}
td.n,th.n{text-align:right;font-variant-numeric:tabular-nums}
tr:last-child td{border-bottom:0}
.muted{color:#656d76}.small{font-size:.88em}
.bad{color:#cf222e;font-weight:600}.ok{color:#1a7f37}
.badge{display:inline-block;min-width:1.8em;padding:0 .45em;border-radius:1em;text-align:center;background:#cf222e;color:#fff;font-weight:600}
.flash{padding:.6em 1em;border-radius:6px;background:#dafbe1;border:1px solid #aceebb}
.flash.bad{background:#ffebe9;border-color:#ffcecb;color:#1f2328;font-weight:normal}
pre{background:#fff;border:1px solid #d0d7de;border-radius:6px;padding:.7em 1em;overflow:auto;max-height:32em;margin:.3em 0 1em;font-size:.9em;white-space:pre-wrap;word-break:break-all}
dl.fields{display:grid;grid-template-columns:max-content 1fr;gap:.25em 1.2em;background:#fff;border:1px solid #d0d7de;border-radius:6px;padding:.8em 1em;margin:.3em 0 1em}
dl.fields dt{color:#656d76}dl.fields dd{margin:0;word-break:break-all}
button,input,select{font:inherit}
button{padding:.25em .8em;border:1px solid #d0d7de;border-radius:6px;background:#f6f8fa;cursor:pointer}
button:hover{background:#eaeef2}
button.danger{color:#cf222e}button.danger:hover{background:#cf222e;color:#fff}
button.primary{background:#1f883d;color:#fff;border-color:#1a7f37}
input[type=text],input[type=password],select{padding:.25em .5em;border:1px solid #d0d7de;border-radius:6px}
.actions{display:flex;gap:.5em;align-items:center;flex-wrap:wrap;margin:.5em 0 1em}
td .actions{flex-wrap:nowrap;margin:0}
.filters{display:flex;gap:1em;align-items:end;flex-wrap:wrap;margin:.5em 0 1em}
.filters label{display:flex;flex-direction:column;font-size:.88em;color:#656d76}
.mono{font-family:ui-monospace,monospace;font-size:.88em}
td.err{min-width:12em;max-width:28em}
.lines3{display:-webkit-box;-webkit-line-clamp:3;-webkit-box-orient:vertical;overflow:hidden}
button{white-space:nowrap;overflow-wrap:normal}
.clip{display:inline-block;max-width:100%;overflow:hidden;text-overflow:ellipsis;white-space:nowrap;vertical-align:bottom}
.clip-s{max-width:9em}.clip-m{max-width:13em}.clip-l{max-width:20em}.clip-id{max-width:37ch}
table.headers{width:100%;table-layout:fixed}table.headers th:first-child{width:30%}
.toolbar{display:flex;gap:1.5em;align-items:center;flex-wrap:wrap;margin:.5em 0}
.toolbar form,.toolbar .actions{margin:0}
.hex{color:#8250df}
td.spark{padding:.2em .7em}
svg.spark{display:block}
.readonly{padding:.6em 1.5em;background:#fff8c5;border-bottom:1px solid #d4a72c;color:#1f2328}
.nowrap{white-space:nowrap}
a.msg,a.instance{text-decoration:none}a.msg:hover,a.instance:hover{text-decoration:underline}
span.k-handled{color:#1a7f37}span.k-retried{color:#bc4c00}span.k-dead{color:#cf222e}span.k-other{color:#57606a}
.kind{display:inline-block;padding:0 .55em;border-radius:1em;font-size:.85em;font-weight:600;white-space:nowrap}
span.kind{color:#fff;background:#6e7781}span.kind.k-handled{background:#1a7f37}span.kind.k-retried{background:#bc4c00}span.kind.k-dead{background:#cf222e}
tr.head.k-dead td{background:#fff5f5}tr.head.k-retried td{background:#fff8f0}
tbody.event tr.head td{border-bottom:0}tr.did td{padding-top:0}
div.err{color:#82071e;overflow-wrap:anywhere;margin-top:.2em}
table.diff{margin:.2em 0;border:0;background:transparent}table.diff td{padding:.1em .6em .1em 0;border:0;overflow-wrap:anywhere}
td.path{color:#57606a}
del{background:#ffebe9;color:#82071e;text-decoration:line-through;text-decoration-color:#cf222e99;padding:0 .2em;border-radius:3px}
ins{background:#dafbe1;color:#116329;text-decoration:none;padding:0 .2em;border-radius:3px}
span.sign{font-weight:600}span.sign.del{color:#cf222e}span.sign.ins{color:#1a7f37}
code.added{background:#dafbe1;color:#116329;padding:0 .2em;border-radius:3px;overflow-wrap:anywhere}
.guess{color:#9a6700;font-style:italic}
ul.timeouts,ul.sent{margin:.2em 0;padding-left:1.2em}
.diagram{overflow-x:auto;background:#fff;border:1px solid #d0d7de;border-radius:6px;padding:.5em;margin:.3em 0 1em}
svg.sequence{display:block}svg.sequence text,svg.axis text{font-family:system-ui,-apple-system,"Segoe UI",Roboto,sans-serif}
svg.sequence text.label{paint-order:stroke;stroke:#fff;stroke-width:4px;stroke-linejoin:round}
svg.sequence text.time{font-family:ui-monospace,monospace;font-size:11px}
svg.axis{display:block;max-width:100%;height:auto;background:#fff;border:1px solid #d0d7de;border-radius:6px;margin:.3em 0 1em}
svg.axis text{font-size:11px;fill:#57606a}
fieldset.outcomes{border:0;padding:0;margin:0;display:flex;gap:.6em;align-items:center;flex-wrap:wrap;font-size:.88em;color:#656d76}
fieldset.outcomes legend{float:left;margin-right:.4em;padding:0}
.filters label.check{flex-direction:row;align-items:center;color:#1f2328;gap:.2em}
"#;

/// A page: the navigation, an optional logout button, an optional banner saying why the
/// console is read-only, `body`.
pub(crate) fn frame(title: &str, logout_csrf: Option<&str>, read_only: Option<&str>, body: &Markup) -> Markup {
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                // No icon: a browser asks for none.
                link rel="icon" href="data:,";
                title { (title) " · Courier console" }
                style { (maud::PreEscaped(STYLE)) }
            }
            body {
                header {
                    a.brand href="/" { "Courier console" }
                    a href="/" { "Queues" }
                    a href="/sagas" { "Sagas" }
                    a href="/timeouts" { "Timeouts" }
                    a href="/outbox" { "Outbox" }
                    @if let Some(csrf) = logout_csrf {
                        form method="post" action="/logout" {
                            input type="hidden" name="csrf" value=(csrf);
                            button type="submit" { "Log out" }
                        }
                    }
                }
                @if let Some(why) = read_only {
                    div.readonly #read-only role="status" { strong { "Read-only. " } (why) "." }
                }
                main { (body) }
            }
        }
    }
}

/// A page for a request that passed the guard: a logout button for a session, and the
/// read-only banner while the console is.
pub(crate) fn page(state: &super::State, viewer: &Viewer, title: &str, body: &Markup) -> Markup {
    let logout = viewer.session.as_ref().map(|_| viewer.csrf.as_str());
    frame(title, logout, state.read_only_note().as_deref(), body)
}

/// An error shown as a page.
#[derive(Debug)]
pub(crate) struct PageError {
    status: StatusCode,
    title: String,
    detail: String,
}

impl PageError {
    pub(crate) fn new(status: StatusCode, title: impl Into<String>, detail: impl Into<String>) -> Self {
        Self {
            status,
            title: title.into(),
            detail: detail.into(),
        }
    }

    /// A bad request: a form or a link with a wrong value.
    pub(crate) fn bad_request(detail: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "Bad request", detail)
    }
}

impl From<AdminError> for PageError {
    fn from(e: AdminError) -> Self {
        let mut text = e.to_string();
        for cause in crate::causes(&e) {
            text.push_str(&format!("; caused by: {cause}"));
        }
        match &e {
            AdminError::NotFound { .. } => Self::new(
                StatusCode::NOT_FOUND,
                "Not found",
                format!(
                    "{text}. It may have been resubmitted, deleted or completed meanwhile (by another operator or \
                     a receiver): go back to the list and look again."
                ),
            ),
            AdminError::Refused { .. } => {
                Self::new(StatusCode::CONFLICT, "Refused", format!("{text}. Nothing was changed."))
            }
            AdminError::Invalid { .. } => Self::bad_request(format!("{text}. Nothing was changed.")),
            _ if e.is_transient() => Self::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "Unavailable",
                format!(
                    "{text}. Check that the broker or database runs and can be reached; nothing was changed. Reload \
                     the page to try again."
                ),
            ),
            _ => Self::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                "Failed",
                format!(
                    "{text}. Nothing was changed (every change is atomic per message). Trying again will not help \
                     until the cause is fixed; the console's log (RUST_LOG=courier=debug) says more."
                ),
            ),
        }
    }
}

impl IntoResponse for PageError {
    fn into_response(self) -> Response {
        let body = html! {
            h1 { (self.title) }
            p.flash.bad { (self.detail) }
            p { a href="/" { "Back to the queues" } }
        };
        (self.status, frame(&self.title, None, None, &body)).into_response()
    }
}

/// A query string, or a page saying what is wrong with it (400).
pub(crate) struct Q<T>(pub(crate) T);

impl<T: serde::de::DeserializeOwned, S: Send + Sync> axum::extract::FromRequestParts<S> for Q<T> {
    type Rejection = PageError;

    async fn from_request_parts(parts: &mut axum::http::request::Parts, state: &S) -> Result<Self, PageError> {
        match axum::extract::Query::<T>::from_request_parts(parts, state).await {
            Ok(axum::extract::Query(v)) => Ok(Q(v)),
            Err(e) => Err(PageError::bad_request(format!(
                "{}: this page's address is incomplete or wrong; open it from the console's links.",
                e.body_text()
            ))),
        }
    }
}

/// A form, or a page saying what is wrong with it (400).
pub(crate) struct F<T>(pub(crate) T);

impl<T: serde::de::DeserializeOwned, S: Send + Sync> axum::extract::FromRequest<S> for F<T> {
    type Rejection = PageError;

    async fn from_request(request: axum::extract::Request, state: &S) -> Result<Self, PageError> {
        match axum::Form::<T>::from_request(request, state).await {
            Ok(axum::Form(v)) => Ok(F(v)),
            Err(e) => Err(PageError::bad_request(format!(
                "{}: send the form from the console's pages. Nothing was changed.",
                e.body_text()
            ))),
        }
    }
}

/// What a handler returns.
pub(crate) type PageResult = Result<Response, PageError>;

/// Any path that is not a page.
pub(crate) async fn not_found() -> PageError {
    PageError::new(
        StatusCode::NOT_FOUND,
        "No such page",
        "There is no page here: start from the queues.",
    )
}

/// A time as shown: `2026-11-26 13:24:12 UTC`.
pub(crate) fn time(t: DateTime<Utc>) -> String {
    t.format("%Y-%m-%d %H:%M:%S UTC").to_string()
}

/// A duration as shown: `45s`, `3m 12s`, `2h 5m`, `3d 4h`.
pub(crate) fn age(d: chrono::Duration) -> String {
    let s = d.num_seconds().max(0);
    match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m {}s", s / 60, s % 60),
        3600..86_400 => format!("{}h {}m", s / 3600, s % 3600 / 60),
        _ => format!("{}d {}h", s / 86_400, s % 86_400 / 3600),
    }
}

/// When `t` is relative to `now`: `3m 12s ago` or `in 4m 0s`.
pub(crate) fn relative(t: DateTime<Utc>, now: DateTime<Utc>) -> String {
    if t <= now {
        format!("{} ago", age(now - t))
    } else {
        format!("in {}", age(t - now))
    }
}

/// A time with how long ago (or until) it is, the exact time on hover.
pub(crate) fn when(t: DateTime<Utc>, now: DateTime<Utc>) -> Markup {
    html! { span title=(time(t)) { (relative(t, now)) } }
}

/// An optional text, `-` when absent.
pub(crate) fn opt(v: Option<&str>) -> Markup {
    match v {
        Some(v) => html! { (v) },
        None => html! { span.muted { "-" } },
    }
}

/// The first `max` characters of `text`, with `…` when cut.
pub(crate) fn short(text: &str, max: usize) -> String {
    let mut chars = text.chars();
    let cut: String = chars.by_ref().take(max).collect();
    if chars.next().is_some() {
        format!("{cut}…")
    } else {
        cut
    }
}

/// The most characters of a value put in a `title` or a clipped cell (the whole value is
/// on its own page: a message's, an instance's).
const MAX_CLIPPED: usize = 2000;

/// How wide a clipped value may be: `S` 9em, `M` 13em, `L` 20em, `Id` a UUID's 36
/// characters (Courier's ids show whole, a longer one is cut).
#[derive(Debug, Clone, Copy)]
pub(crate) enum Width {
    S,
    M,
    L,
    Id,
}

/// `text` on one line, cut with `…` where it is wider than `width`, the whole text on hover
/// (its `title`).
pub(crate) fn clip(text: &str, width: Width) -> Markup {
    let class = match width {
        Width::S => "clip clip-s",
        Width::M => "clip clip-m",
        Width::L => "clip clip-l",
        Width::Id => "clip clip-id",
    };
    let text = short(text, MAX_CLIPPED);
    html! { span class=(class) title=(text) { (text) } }
}

/// [`clip`] of an optional text, `-` when absent.
pub(crate) fn clip_opt(text: Option<&str>, width: Width) -> Markup {
    match text {
        Some(t) => clip(t, width),
        None => html! { span.muted { "-" } },
    }
}

/// Parses an age typed in a filter: `90s`, `15m`, `2h`, `3d`, or seconds.
pub(crate) fn parse_age(text: &str) -> Result<chrono::Duration, PageError> {
    let text = text.trim();
    let (number, unit) = text.split_at(text.find(|c: char| !c.is_ascii_digit()).unwrap_or(text.len()));
    let n: i64 = number
        .parse()
        .map_err(|_| PageError::bad_request(format!("\"{text}\" is not an age: write 90s, 15m, 2h or 3d")))?;
    let seconds = match unit.trim() {
        "" | "s" => 1,
        "m" => 60,
        "h" => 3600,
        "d" => 86_400,
        _ => {
            return Err(PageError::bad_request(format!(
                "\"{text}\" is not an age: write 90s, 15m, 2h or 3d"
            )));
        }
    };
    Ok(chrono::Duration::seconds(n.saturating_mul(seconds)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ages_read_like_the_command_lines() {
        assert_eq!(age(chrono::Duration::seconds(45)), "45s");
        assert_eq!(age(chrono::Duration::seconds(192)), "3m 12s");
        assert_eq!(age(chrono::Duration::seconds(7500)), "2h 5m");
        assert_eq!(age(chrono::Duration::seconds(273_600)), "3d 4h");
        assert_eq!(parse_age("15m").map(|d| d.num_seconds()).ok(), Some(900));
        assert_eq!(parse_age("90").map(|d| d.num_seconds()).ok(), Some(90));
        assert!(parse_age("soon").is_err());
        assert_eq!(short("abcdef", 3), "abc…");
    }

    proptest::proptest! {
        /// Any text a producer writes is clipped as text: one element, its whole text (up
        /// to the limit) escaped in the title and the content, never markup.
        #[test]
        fn a_clipped_value_is_text(text in r"(\PC|[<>&\x22'\\]){0,2100}") {
            let html = clip(&text, Width::M).into_string();
            proptest::prop_assert_eq!(html.matches('<').count(), 2, "{}", html);
            let escaped = html! { (short(&text, MAX_CLIPPED)) }.into_string();
            proptest::prop_assert!(html.contains(&format!("title=\"{escaped}\">{escaped}</span>")), "{}", html);
        }
    }

    #[test]
    fn values_are_escaped() {
        let page = frame(
            "t",
            None,
            None,
            &html! { pre { (opt(Some("<script>alert(1)</script>"))) } },
        )
        .into_string();
        assert!(page.contains("&lt;script&gt;alert(1)&lt;/script&gt;"), "{page}");
        assert!(!page.contains("<script>"));
    }
}
