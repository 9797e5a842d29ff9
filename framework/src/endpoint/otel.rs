//! OpenTelemetry for Courier's spans (feature `opentelemetry`).
//!
//! The trace context of a message travels in its headers through the propagator the
//! application installed (`opentelemetry::global::set_text_map_propagator`); when it
//! installed none (OpenTelemetry's default is a no-op), through Courier's own W3C code
//! (`traceparent`, `tracestate`). The spans Courier opens carry the names, kinds and
//! attributes of OpenTelemetry's messaging semantic conventions, so `tracing-opentelemetry`
//! exports them as children of the sender's span:
//!
//! | tracing span | OpenTelemetry name | kind | parent |
//! |---|---|---|---|
//! | `message` | `process {queue}` | consumer | the context extracted from the message |
//! | `handle` | `handle {handler}` | internal | `message` |
//! | `saga`, `timeout` | `saga {saga}`, `timeout {saga}` | internal | `message` |
//! | `send` | `send {destination}` (`Bus`), `create {destination}` (in a handler) | producer | the current span |
//! | `dispatch` | `send {destination}` (or `send` for several) | producer | the current span; a link to each message's `create` span |
//!
//! The context injected into a message is its `send` span's: outside a handler that span
//! covers the send itself; inside a handler the message leaves at the commit (or later,
//! through the outbox, or when a saga timeout is due), so its span is a short `create`
//! span under the handler's span, as the conventions describe for messages created
//! before they are sent. The send itself, after the commit (or by the outbox sweeper), is
//! a `dispatch` span with a link to the `create` span of each message it sends.
//!
//! Without the feature the functions here are empty stand-ins (their span is `NoSpan`),
//! so the call sites in the runtime, the bus, the handlers and the saga runtime carry no
//! `cfg`, and the headers come from Courier's W3C code alone (`trace.rs`), with the same
//! names and format.

/// What a producer span stands for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Operation {
    /// A message created in a handler; it leaves at the commit or later.
    Create,
    /// A message sent at once (the [`Bus`](crate::Bus)).
    Send,
}

#[cfg(feature = "opentelemetry")]
pub(crate) use enabled::*;

#[cfg(not(feature = "opentelemetry"))]
pub(crate) use disabled::*;

#[cfg(feature = "opentelemetry")]
mod enabled {
    use std::future::Future;

    use opentelemetry::propagation::{Extractor, Injector, TextMapPropagator};
    use opentelemetry::trace::{SpanContext, SpanId, Status, TraceContextExt, TraceFlags, TraceId, TraceState};
    use tracing::Instrument;
    use tracing::field::display;
    use tracing_opentelemetry::OpenTelemetrySpanExt;

    use super::Operation;
    use crate::endpoint::Failure;
    use crate::endpoint::bus::Outgoing;
    use crate::endpoint::trace::{TRACEPARENT, TRACESTATE, TraceContext};
    use crate::message::{Envelope, Properties, PropertyValue, ReceivedMessage};

    /// A span Courier opened.
    pub(crate) type Span = tracing::Span;

    /// Attribute names: OpenTelemetry's messaging semantic conventions, and Courier's own.
    pub(crate) mod attributes {
        pub(crate) const SYSTEM: &str = "messaging.system";
        pub(crate) const DESTINATION: &str = "messaging.destination.name";
        pub(crate) const OPERATION_TYPE: &str = "messaging.operation.type";
        pub(crate) const OPERATION_NAME: &str = "messaging.operation.name";
        pub(crate) const MESSAGE_ID: &str = "messaging.message.id";
        pub(crate) const CONVERSATION_ID: &str = "messaging.message.conversation_id";
        pub(crate) const BODY_SIZE: &str = "messaging.message.body.size";
        pub(crate) const ERROR_TYPE: &str = "error.type";
        pub(crate) const MESSAGE_TYPE: &str = "courier.message.type";
        pub(crate) const DESTINATION_KIND: &str = "courier.destination.kind";
        pub(crate) const SAGA_CORRELATION: &str = "courier.saga.correlation";
        pub(crate) const BATCH_COUNT: &str = "messaging.batch.message_count";
    }

    /// The span of sending messages created earlier (a handler's, after its commit; the
    /// outbox's): `send {destination}` (`send` when they go to several), a producer span
    /// under the current span, with a link to the `create` span of each message (the
    /// context in its headers) and the number of messages.
    pub(crate) fn dispatch_span<'a>(
        system: &'static str,
        messages: impl Iterator<Item = (&'a str, &'a Envelope)>,
    ) -> Span {
        let span = tracing::info_span!("dispatch", otel.name = tracing::field::Empty, otel.kind = "producer");
        if span.is_disabled() {
            return span;
        }
        let (mut count, mut destination, mut several) = (0_i64, None::<&str>, false);
        for (to, envelope) in messages {
            count += 1;
            match destination {
                None => destination = Some(to),
                Some(first) if first != to => several = true,
                Some(_) => {}
            }
            let created = extract(&envelope.properties).span().span_context().clone();
            if created.is_valid() {
                span.add_link(created);
            }
        }
        match destination.filter(|_| !several) {
            Some(to) => {
                span.record("otel.name", display(format_args!("send {to}")));
                span.set_attribute(attributes::DESTINATION, to.to_owned());
            }
            None => {
                span.record("otel.name", "send");
            }
        }
        span.set_attribute(attributes::SYSTEM, system);
        span.set_attribute(attributes::OPERATION_TYPE, "send");
        span.set_attribute(attributes::OPERATION_NAME, "send");
        span.set_attribute(attributes::BATCH_COUNT, count);
        span
    }

    /// Makes the `message` span of a delivery (declared with empty `otel.name` and
    /// `otel.kind`) the consumer span of the message: its name, kind and attributes, and
    /// its parent, the context extracted from the message's headers. Returns the trace
    /// position of the handling: the OpenTelemetry span's when a `tracing-opentelemetry`
    /// layer records the span (the span's `trace_id` and `span_id` fields are set to
    /// it, so logs and traces agree), else `fallback` (Courier's own).
    pub(crate) fn consumer(
        span: &tracing::Span,
        system: &'static str,
        queue: &str,
        message: &ReceivedMessage,
        fallback: TraceContext,
    ) -> TraceContext {
        if span.is_disabled() {
            return fallback;
        }
        // Without a valid context in the headers the parent is an empty context: the span
        // starts a new trace. This fails only without a tracing-opentelemetry layer, and
        // then there is nothing more to do.
        if span.set_parent(extract(&message.envelope.properties)).is_err() {
            return fallback;
        }
        span.record("otel.name", display(format_args!("process {queue}")));
        span.record("otel.kind", "consumer");
        message_attributes(span, system, queue, &message.envelope, "process");
        match position(span) {
            Some(own) => {
                // A formatting layer shows a field recorded again twice: only what changed.
                if own.trace_id() != fallback.trace_id() {
                    span.record("trace_id", display(own.trace_id()));
                }
                span.record("span_id", display(own.span_id()));
                own
            }
            None => fallback,
        }
    }

    /// The span of one handler's run.
    pub(crate) fn handle_span(handler: &'static str, message_type: &'static str) -> Span {
        tracing::info_span!(
            "handle",
            otel.name = %format_args!("handle {handler}"),
            courier.handler.name = handler,
            courier.message.type = message_type,
        )
    }

    /// The span of a saga handler's run; `timeout` for the handler of a timeout.
    pub(crate) fn saga_span(saga: &'static str, handler: &'static str, timeout: bool) -> Span {
        if timeout {
            tracing::info_span!(
                "timeout",
                otel.name = %format_args!("timeout {saga}"),
                courier.saga.type = saga,
                courier.handler.name = handler,
            )
        } else {
            tracing::info_span!(
                "saga",
                otel.name = %format_args!("saga {saga}"),
                courier.saga.type = saga,
                courier.handler.name = handler,
            )
        }
    }

    /// Sets the correlation value of the saga instance on the current (saga) span.
    pub(crate) fn saga_correlation(correlation: &str) {
        let span = tracing::Span::current();
        if !span.is_disabled() {
            span.set_attribute(attributes::SAGA_CORRELATION, correlation.to_owned());
        }
    }

    /// Runs `work` in `span`; a failure sets the span's status to error, with its
    /// `error.type` (the values of the metrics' label).
    pub(crate) async fn in_span<T>(span: Span, work: impl Future<Output = Result<T, Failure>>) -> Result<T, Failure> {
        let out = work.instrument(span.clone()).await;
        if let Err(failure) = &out {
            let kind = crate::endpoint::metrics::error_type(failure);
            span.set_attribute(attributes::ERROR_TYPE, kind);
            span.set_status(Status::error(kind));
        }
        out
    }

    /// Runs `work` in `span`.
    pub(crate) fn instrument<F: Future>(work: F, span: Span) -> tracing::instrument::Instrumented<F> {
        work.instrument(span)
    }

    /// Opens the producer span of `out` under the current span and injects its context
    /// into the message's headers: the `traceparent` (and `tracestate`) Courier always
    /// writes, then whatever the installed propagator writes. Without a
    /// `tracing-opentelemetry` layer the headers stay as `prepare` wrote them.
    pub(crate) fn producer(out: &mut Outgoing, system: &'static str, operation: Operation) -> Span {
        let op = match operation {
            Operation::Create => "create",
            Operation::Send => "send",
        };
        let span = tracing::info_span!(
            "send",
            otel.name = %format_args!("{op} {}", out.destination),
            otel.kind = "producer",
        );
        if span.is_disabled() {
            return span;
        }
        message_attributes(&span, system, &out.destination, &out.envelope, op);
        span.set_attribute(
            attributes::DESTINATION_KIND,
            if out.is_topic { "topic" } else { "queue" },
        );
        inject(&span, &mut out.envelope.properties);
        span
    }

    fn message_attributes(
        span: &tracing::Span,
        system: &'static str,
        destination: &str,
        envelope: &Envelope,
        operation: &'static str,
    ) {
        span.set_attribute(attributes::SYSTEM, system);
        span.set_attribute(attributes::DESTINATION, destination.to_owned());
        span.set_attribute(attributes::OPERATION_TYPE, operation);
        span.set_attribute(attributes::OPERATION_NAME, operation);
        span.set_attribute(attributes::MESSAGE_ID, envelope.message_id.clone());
        if let Some(correlation) = &envelope.correlation_id {
            span.set_attribute(attributes::CONVERSATION_ID, correlation.clone());
        }
        if let Ok(size) = i64::try_from(envelope.body.len()) {
            span.set_attribute(attributes::BODY_SIZE, size);
        }
        if let Some(message_type) = &envelope.message_type {
            span.set_attribute(attributes::MESSAGE_TYPE, message_type.clone());
        }
    }

    /// The OpenTelemetry span context of `span` as a trace position, if a layer records it.
    fn position(span: &tracing::Span) -> Option<TraceContext> {
        let cx = span.context();
        let sc = cx.span().span_context().clone();
        TraceContext::from_raw(
            sc.trace_id().to_bytes(),
            sc.span_id().to_bytes(),
            sc.trace_flags().to_u8(),
        )
    }

    /// Whether the application installed a propagator (OpenTelemetry's default, the
    /// no-op one, has no fields).
    fn installed(propagator: &dyn TextMapPropagator) -> bool {
        propagator.fields().next().is_some()
    }

    /// Writes the context of `span` into `properties`.
    pub(crate) fn inject(span: &tracing::Span, properties: &mut Properties) {
        let cx = span.context();
        w3c_inject(cx.span().span_context(), properties);
        if !cx.span().span_context().is_valid() {
            return;
        }
        opentelemetry::global::get_text_map_propagator(|propagator| {
            if installed(propagator) {
                propagator.inject_context(&cx, &mut Carrier(properties));
            }
        });
    }

    /// Courier's W3C headers for `sc` (nothing for an invalid context).
    pub(crate) fn w3c_inject(sc: &SpanContext, properties: &mut Properties) {
        let Some(own) = TraceContext::from_raw(
            sc.trace_id().to_bytes(),
            sc.span_id().to_bytes(),
            sc.trace_flags().to_u8(),
        ) else {
            return;
        };
        properties.insert(TRACEPARENT.to_owned(), PropertyValue::String(own.to_string()));
        let state = sc.trace_state().header();
        if !state.is_empty() {
            properties.insert(TRACESTATE.to_owned(), PropertyValue::String(state));
        }
    }

    /// The context a message's headers carry: through the installed propagator, else
    /// (or when it finds none) from the W3C headers.
    pub(crate) fn extract(properties: &Properties) -> opentelemetry::Context {
        let through_propagator = opentelemetry::global::get_text_map_propagator(|propagator| {
            installed(propagator)
                .then(|| propagator.extract_with_context(&opentelemetry::Context::new(), &Reader(properties)))
        });
        match through_propagator {
            Some(cx) if cx.span().span_context().is_valid() => cx,
            _ => w3c_extract(properties),
        }
    }

    /// The remote span context of the W3C headers (an empty context without a valid
    /// `traceparent`).
    pub(crate) fn w3c_extract(properties: &Properties) -> opentelemetry::Context {
        let Some(parent) = TraceContext::from_properties(properties) else {
            return opentelemetry::Context::new();
        };
        let state = match properties.get(TRACESTATE) {
            Some(PropertyValue::String(s)) => s.parse::<TraceState>().unwrap_or_default(),
            _ => TraceState::default(),
        };
        let (trace_id, span_id, flags) = parent.raw();
        let sc = SpanContext::new(
            TraceId::from_bytes(trace_id),
            SpanId::from_bytes(span_id),
            TraceFlags::new(flags),
            true,
            state,
        );
        opentelemetry::Context::new().with_remote_span_context(sc)
    }

    /// Headers as a propagator's carrier (string values only).
    struct Carrier<'a>(&'a mut Properties);

    impl Injector for Carrier<'_> {
        fn set(&mut self, key: &str, value: String) {
            self.0.insert(key.to_owned(), PropertyValue::String(value));
        }
    }

    struct Reader<'a>(&'a Properties);

    impl Extractor for Reader<'_> {
        fn get(&self, key: &str) -> Option<&str> {
            match self.0.get(key) {
                Some(PropertyValue::String(s)) => Some(s),
                _ => None,
            }
        }

        fn keys(&self) -> Vec<&str> {
            self.0.keys().map(String::as_str).collect()
        }
    }
}

#[cfg(not(feature = "opentelemetry"))]
mod disabled {
    use std::future::Future;

    use super::Operation;
    use crate::endpoint::Failure;
    use crate::endpoint::bus::Outgoing;
    use crate::endpoint::trace::TraceContext;
    use crate::message::{Envelope, ReceivedMessage};

    /// No span: the feature `opentelemetry` is off.
    #[derive(Debug, Clone, Copy)]
    pub(crate) struct NoSpan;

    /// A span Courier opened (none without the feature).
    pub(crate) type Span = NoSpan;

    #[inline]
    pub(crate) fn consumer(
        _: &tracing::Span,
        _: &'static str,
        _: &str,
        _: &ReceivedMessage,
        fallback: TraceContext,
    ) -> TraceContext {
        fallback
    }

    #[inline]
    pub(crate) fn handle_span(_: &'static str, _: &'static str) -> Span {
        NoSpan
    }

    #[inline]
    pub(crate) fn saga_span(_: &'static str, _: &'static str, _: bool) -> Span {
        NoSpan
    }

    #[inline]
    pub(crate) fn saga_correlation(_: &str) {}

    #[inline]
    pub(crate) fn in_span<T, F: Future<Output = Result<T, Failure>>>(_: Span, work: F) -> F {
        work
    }

    #[inline]
    pub(crate) fn instrument<F: Future>(work: F, _: Span) -> F {
        work
    }

    #[inline]
    pub(crate) fn producer(_: &mut Outgoing, _: &'static str, _: Operation) -> Span {
        NoSpan
    }

    #[inline]
    pub(crate) fn dispatch_span<'a>(_: &'static str, _: impl Iterator<Item = (&'a str, &'a Envelope)>) -> Span {
        NoSpan
    }
}

#[cfg(all(test, feature = "opentelemetry"))]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use opentelemetry::trace::{SpanContext, SpanId, TraceContextExt, TraceFlags, TraceId, TraceState};

    use super::*;
    use crate::endpoint::trace::{TRACEPARENT, TRACESTATE, TraceContext};
    use crate::message::{Properties, PropertyValue};

    fn text(p: &Properties, key: &str) -> Option<String> {
        match p.get(key) {
            Some(PropertyValue::String(s)) => Some(s.clone()),
            _ => None,
        }
    }

    #[test]
    fn w3c_headers_round_trip_an_opentelemetry_span_context() {
        let sc = SpanContext::new(
            TraceId::from_hex("4bf92f3577b34da6a3ce929d0e0e4736").unwrap(),
            SpanId::from_hex("00f067aa0ba902b7").unwrap(),
            TraceFlags::SAMPLED,
            false,
            "vendor=value".parse::<TraceState>().unwrap(),
        );
        let mut p = Properties::new();
        w3c_inject(&sc, &mut p);
        assert_eq!(
            text(&p, TRACEPARENT).as_deref(),
            Some("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"),
            "the format of Courier's own header, which a build without the feature reads"
        );
        assert_eq!(text(&p, TRACESTATE).as_deref(), Some("vendor=value"));
        let back = w3c_extract(&p);
        let back = back.span().span_context().clone();
        assert_eq!(back.trace_id(), sc.trace_id());
        assert_eq!(back.span_id(), sc.span_id());
        assert!(back.is_sampled());
        assert!(back.is_remote());
        assert_eq!(back.trace_state().header(), "vendor=value");
    }

    #[test]
    fn no_opentelemetry_context_leaves_the_headers_alone() {
        let mut p = Properties::new();
        p.insert(
            TRACEPARENT.to_owned(),
            PropertyValue::String("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00".into()),
        );
        let before = p.clone();
        w3c_inject(&SpanContext::empty_context(), &mut p);
        inject(&tracing::Span::none(), &mut p);
        assert_eq!(p, before);
        let cx = w3c_extract(&p);
        assert!(!cx.span().span_context().is_sampled(), "flags 00 read as not sampled");
        assert!(!w3c_extract(&Properties::new()).span().span_context().is_valid());
    }

    #[test]
    fn a_traceparent_courier_wrote_is_what_opentelemetry_reads() {
        let t = TraceContext::new_root();
        let mut p = Properties::new();
        p.insert(TRACEPARENT.to_owned(), PropertyValue::String(t.to_string()));
        let cx = extract(&p);
        let sc = cx.span().span_context().clone();
        assert_eq!(format!("{:032x}", sc.trace_id()), t.trace_id());
        assert_eq!(format!("{:016x}", sc.span_id()), t.span_id());
    }
}
