//! A test's log, captured: warnings and errors written by `tracing` while the returned
//! guard lives, read back as text. The subscriber is the current thread's, so a test
//! that reads it runs on a current-thread runtime (events of other threads go elsewhere).

use std::sync::{Arc, Mutex, PoisonError};

/// What was logged, shared with the subscriber that writes it.
#[derive(Clone, Default)]
pub struct Logs(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Logs {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for Logs {
    type Writer = Logs;

    fn make_writer(&'a self) -> Logs {
        self.clone()
    }
}

impl Logs {
    /// Captures this thread's warnings and errors (no colours) until the guard drops.
    pub fn capture(&self) -> Capturing {
        self.capture_at(tracing::Level::WARN)
    }

    /// Captures this thread's events and spans of `level` and above (no colours) until the
    /// guard drops: at `INFO` a line shows the fields of its spans (Courier's `message`
    /// span is at `INFO`).
    pub fn capture_at(&self, level: tracing::Level) -> Capturing {
        let subscriber = tracing_subscriber::fmt()
            .with_writer(self.clone())
            .with_ansi(false)
            .with_max_level(level)
            .finish();
        // tracing-core caches whether each callsite is enabled, for every thread. While a
        // single subscriber is registered it asks only the subscriber of the thread that
        // first reaches a callsite: a test of another thread, with none, would disable
        // the callsite here too (this subscriber then misses INFO lines and spans). A
        // second registered one, alive as long as the guard, makes it ask them all.
        let second = tracing::Dispatch::new(tracing::subscriber::NoSubscriber::default());
        let default = tracing::subscriber::set_default(subscriber);
        tracing::callsite::rebuild_interest_cache();
        Capturing {
            _default: default,
            _second: second,
        }
    }

    /// Everything captured so far.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap_or_else(PoisonError::into_inner)).into_owned()
    }
}

/// While it lives, the log of this thread is captured ([`Logs::capture`]).
#[must_use = "the capture ends when the guard drops"]
pub struct Capturing {
    _default: tracing::subscriber::DefaultGuard,
    _second: tracing::Dispatch,
}
