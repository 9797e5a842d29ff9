//! W3C trace context (`traceparent`) carried in message properties, so that a trace
//! continues across endpoints.

use std::fmt;

use uuid::Uuid;

use crate::message::{Properties, PropertyValue};

/// The property that carries the W3C `traceparent` value.
pub const TRACEPARENT: &str = "traceparent";
/// The property that carries the W3C `tracestate` value (passed on unchanged).
pub const TRACESTATE: &str = "tracestate";

/// One position in a distributed trace: the trace, the span, the sampling flags.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct TraceContext {
    trace_id: [u8; 16],
    span_id: [u8; 8],
    flags: u8,
}

impl TraceContext {
    /// A new trace with a fresh root span (sampled).
    pub fn new_root() -> Self {
        Self {
            trace_id: new_trace_id(),
            span_id: new_span_id(),
            flags: 1,
        }
    }

    /// A new span in the same trace, with this one as its parent.
    #[must_use]
    pub fn child(&self) -> Self {
        Self {
            trace_id: self.trace_id,
            span_id: new_span_id(),
            flags: self.flags,
        }
    }

    /// Parses a `traceparent` value (version `00`, or a later version read as `00`).
    pub fn parse(value: &str) -> Option<Self> {
        let mut parts = value.trim().split('-');
        let version = parts.next()?;
        let trace = parts.next()?;
        let span = parts.next()?;
        let flags = parts.next()?;
        if version.len() != 2 || version == "ff" || (version == "00" && parts.next().is_some()) {
            return None;
        }
        u8::from_str_radix(version, 16).ok()?;
        let mut trace_id = [0u8; 16];
        let mut span_id = [0u8; 8];
        decode_hex(trace, &mut trace_id)?;
        decode_hex(span, &mut span_id)?;
        let mut flag = [0u8; 1];
        decode_hex(flags, &mut flag)?;
        if trace_id == [0; 16] || span_id == [0; 8] {
            return None;
        }
        Some(Self {
            trace_id,
            span_id,
            flags: flag[0],
        })
    }

    /// Reads the `traceparent` property of a message.
    pub fn from_properties(properties: &Properties) -> Option<Self> {
        match properties.get(TRACEPARENT) {
            Some(PropertyValue::String(s)) => Self::parse(s),
            _ => None,
        }
    }

    /// The trace id, 32 lowercase hex digits.
    pub fn trace_id(&self) -> String {
        hex(&self.trace_id)
    }

    /// The span id, 16 lowercase hex digits.
    pub fn span_id(&self) -> String {
        hex(&self.span_id)
    }

    /// Whether the trace is sampled.
    pub fn sampled(&self) -> bool {
        self.flags & 1 == 1
    }

    /// A position from its raw parts (an OpenTelemetry span context); `None` for the
    /// all-zero ids W3C calls invalid.
    #[cfg(feature = "opentelemetry")]
    pub(crate) fn from_raw(trace_id: [u8; 16], span_id: [u8; 8], flags: u8) -> Option<Self> {
        (trace_id != [0; 16] && span_id != [0; 8]).then_some(Self {
            trace_id,
            span_id,
            flags,
        })
    }

    /// The raw parts: trace id, span id, flags.
    #[cfg(feature = "opentelemetry")]
    pub(crate) fn raw(&self) -> ([u8; 16], [u8; 8], u8) {
        (self.trace_id, self.span_id, self.flags)
    }
}

impl fmt::Display for TraceContext {
    /// The `traceparent` value.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "00-{}-{}-{:02x}", self.trace_id(), self.span_id(), self.flags)
    }
}

impl fmt::Debug for TraceContext {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "TraceContext({self})")
    }
}

thread_local! {
    /// Per-thread SplitMix64 state, seeded once from the operating system's randomness:
    /// span ids are made per message, and a system call each time would cost more than
    /// the rest of the id handling.
    static RNG: std::cell::Cell<u64> = std::cell::Cell::new(seed());
}

fn seed() -> u64 {
    let bytes = Uuid::new_v4().into_bytes();
    let mut s = [0u8; 8];
    s.copy_from_slice(&bytes[..8]);
    u64::from_le_bytes(s)
}

fn next_random() -> u64 {
    RNG.with(|state| {
        let mut z = state.get().wrapping_add(0x9E37_79B9_7F4A_7C15);
        state.set(z);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    })
}

fn new_span_id() -> [u8; 8] {
    let mut id = next_random().to_le_bytes();
    if id == [0; 8] {
        id[7] = 1;
    }
    id
}

fn new_trace_id() -> [u8; 16] {
    let mut id = [0u8; 16];
    id[..8].copy_from_slice(&next_random().to_le_bytes());
    id[8..].copy_from_slice(&next_random().to_le_bytes());
    if id == [0; 16] {
        id[15] = 1;
    }
    id
}

/// `bytes` as lowercase hex digits (also the retry seal's text, `retry_seal.rs`).
pub(crate) fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        s.push(char::from(DIGITS[usize::from(b >> 4)]));
        s.push(char::from(DIGITS[usize::from(b & 15)]));
    }
    s
}

fn decode_hex(s: &str, out: &mut [u8]) -> Option<()> {
    if s.len() != out.len() * 2 || !s.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)) {
        return None;
    }
    for (i, o) in out.iter_mut().enumerate() {
        *o = u8::from_str_radix(s.get(i * 2..i * 2 + 2)?, 16).ok()?;
    }
    Some(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_formats_traceparent() {
        let v = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let t = TraceContext::parse(v).unwrap();
        assert_eq!(t.to_string(), v);
        assert_eq!(t.trace_id(), "4bf92f3577b34da6a3ce929d0e0e4736");
        assert!(t.sampled());
        let c = t.child();
        assert_eq!(c.trace_id(), t.trace_id());
        assert_ne!(c.span_id(), t.span_id());
    }

    #[test]
    fn refuses_malformed_traceparent() {
        for bad in [
            "",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
        ] {
            assert!(TraceContext::parse(bad).is_none(), "{bad}");
        }
        assert!(TraceContext::parse("01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-future").is_some());
    }
}
