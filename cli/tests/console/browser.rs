//! Headless Chromium driven over WebDriver, through a chromedriver each test starts on a
//! free port.

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use fantoccini::{Client, ClientBuilder, Locator};
use hyper_util::client::legacy::connect::HttpConnector;

/// Headless Chromium behind a chromedriver this test started.
pub(crate) struct Browser {
    pub(crate) client: Client,
    pub(crate) driver: Child,
    /// The chromedriver's port and the session, to end it from `drop` when a test failed
    /// (killing chromedriver alone would leave its Chromium running).
    pub(crate) port: u16,
    pub(crate) session: Option<String>,
    pub(crate) _profile: tempfile::TempDir,
}

pub(crate) const INSTALL: &str = "the console's browser tests need Chromium and its WebDriver: install them with \
     `apt-get install chromium chromium-driver` (Debian; .ci/run and scripts/test.sh do it when run as root), \
     or set CHROMEDRIVER to a chromedriver (and CHROMIUM to its browser)";

impl Browser {
    pub(crate) async fn start() -> Self {
        let driver_bin = std::env::var("CHROMEDRIVER").unwrap_or_else(|_| "chromedriver".into());
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let driver = Command::new(&driver_bin)
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start `{driver_bin}` ({e}): {INSTALL}"));
        let profile = tempfile::tempdir().unwrap();
        let mut options = serde_json::json!({
            "args": [
                "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                "--disable-background-networking", "--disable-component-update", "--disable-sync",
                "--disable-dev-shm-usage", "--window-size=1280,900", "--hide-scrollbars",
                format!("--user-data-dir={}", profile.path().display()),
            ],
        });
        let chromium = std::env::var("CHROMIUM").ok().or_else(|| {
            ["/usr/bin/chromium", "/usr/bin/chromium-browser"]
                .into_iter()
                .find(|p| std::path::Path::new(p).exists())
                .map(str::to_owned)
        });
        if let Some(binary) = chromium {
            options["binary"] = binary.into();
        }
        let mut caps = serde_json::Map::new();
        caps.insert("goog:chromeOptions".into(), options);
        let url = format!("http://127.0.0.1:{port}");
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        let mut driver = driver;
        let client = loop {
            match ClientBuilder::new(HttpConnector::new())
                .capabilities(caps.clone())
                .connect(&url)
                .await
            {
                Ok(c) => break c,
                Err(e) => {
                    if let Ok(Some(status)) = driver.try_wait() {
                        panic!("`{driver_bin}` exited ({status}) before a session started: {INSTALL}");
                    }
                    if tokio::time::Instant::now() >= deadline {
                        let _ = driver.kill();
                        panic!("no browser session from `{driver_bin}` within 60 s ({e}): {INSTALL}");
                    }
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        };
        let session = client.session_id().await.unwrap();
        let browser = Self {
            client,
            driver,
            port,
            session,
            _profile: profile,
        };
        browser.client.set_window_size(1280, 900).await.unwrap();
        browser
    }

    /// The text of the first element `css` selects (waiting for it to appear). Found again
    /// when the page is replaced between finding it and reading it (a navigation still
    /// under way: "Node with given id does not belong to the document", seen in CI).
    pub(crate) async fn text(&self, css: &str) -> String {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        loop {
            let found = self
                .client
                .wait()
                .at_most(Duration::from_secs(20))
                .for_element(Locator::Css(css))
                .await
                .unwrap_or_else(|e| panic!("no {css} on the page ({e})"));
            match found.text().await {
                Ok(text) => return text,
                Err(e) => {
                    assert!(
                        tokio::time::Instant::now() < deadline,
                        "cannot read {css} on the page ({e})"
                    );
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        }
    }

    /// Waits until the page's address contains `part`: a form's submit returns before
    /// the browser has left the page it was on, whose elements still answer.
    pub(crate) async fn wait_for_url(&self, part: &str) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        loop {
            let url = self.client.current_url().await.unwrap();
            if url.as_str().contains(part) {
                return;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "the browser never reached {part}: at {url}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Waits until the first element `css` selects contains `needle` (after a submit that
    /// stays on a page of the same shape), and returns its text.
    pub(crate) async fn wait_for_text(&self, css: &str, needle: &str) -> String {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        loop {
            let text = self.text(css).await;
            if text.contains(needle) {
                return text;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "{css} never said {needle:?}: {text:?}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    pub(crate) async fn has(&self, css: &str) -> bool {
        !self.client.find_all(Locator::Css(css)).await.unwrap().is_empty()
    }

    /// Saves a PNG of the page as DIR/`name`.png when COURIER_CONSOLE_SCREENSHOTS=DIR.
    pub(crate) async fn screenshot(&self, name: &str) {
        if let Ok(dir) = std::env::var("COURIER_CONSOLE_SCREENSHOTS") {
            // Relative to the workspace, where the command is run from.
            let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(dir);
            std::fs::create_dir_all(&dir).unwrap();
            let png = self.client.screenshot().await.unwrap();
            std::fs::write(dir.join(format!("{name}.png")), png).unwrap();
        }
    }

    pub(crate) async fn close(mut self) {
        self.client.clone().close().await.unwrap();
        self.session = None;
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        // A test that failed did not close its session: end it (and so its Chromium) with
        // a blocking request, then stop chromedriver.
        if let Some(session) = self.session.take() {
            use std::io::{Read, Write};
            if let Ok(mut stream) = std::net::TcpStream::connect(("127.0.0.1", self.port)) {
                let _ = stream.set_read_timeout(Some(Duration::from_secs(10)));
                let _ = write!(
                    stream,
                    "DELETE /session/{session} HTTP/1.1\r\nHost: 127.0.0.1:{}\r\nConnection: close\r\n\r\n",
                    self.port
                );
                let _ = stream.read_to_end(&mut Vec::new());
            }
        }
        let _ = self.driver.kill();
        let _ = self.driver.wait();
    }
}
