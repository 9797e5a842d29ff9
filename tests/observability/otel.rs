//! OpenTelemetry traces (feature `opentelemetry`): Courier's spans exported through
//! `tracing-opentelemetry` to opentelemetry_sdk's in-memory exporter. One subscriber is
//! installed for the whole binary (a subscriber per test thread lost spans when tests ran
//! in parallel: tracing caches a callsite's interest across threads), and each test reads
//! only the spans of its own trace, so the tests run in parallel with each other and with
//! the metrics tests (whose spans are exported too, in traces of their own).

use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use courier::saga::SagaContext;
use courier::testing::TestEndpoint;
use courier::{Clock, Context, Endpoint, HandlerError, Message, PropertyValue, Routes, TRACEPARENT, Transport};
use courier_tests::eventually;
use opentelemetry::propagation::{Extractor, Injector, TextMapPropagator};
use opentelemetry::trace::{SpanId, SpanKind, TraceContextExt, TraceId, TracerProvider as _};
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider, SpanData};
use serde::{Deserialize, Serialize};
use tracing::Instrument;
use tracing_opentelemetry::OpenTelemetrySpanExt;
use tracing_subscriber::layer::SubscriberExt;

/// The header the test propagator adds: it shows the propagator the application installed
/// wrote the message's headers.
const MARK: &str = "test-propagator";

/// W3C trace context plus a header of its own: what an application's propagator (B3,
/// Jaeger, a composite) would add to the messages.
#[derive(Debug, Default)]
struct MarkingPropagator {
    w3c: TraceContextPropagator,
}

impl TextMapPropagator for MarkingPropagator {
    fn inject_context(&self, cx: &opentelemetry::Context, injector: &mut dyn Injector) {
        self.w3c.inject_context(cx, injector);
        injector.set(MARK, cx.span().span_context().span_id().to_string());
    }

    fn extract_with_context(&self, cx: &opentelemetry::Context, extractor: &dyn Extractor) -> opentelemetry::Context {
        self.w3c.extract_with_context(cx, extractor)
    }

    fn fields(&self) -> opentelemetry::propagation::text_map_propagator::FieldIter<'_> {
        self.w3c.fields()
    }
}

/// Installs the marking propagator for the whole binary (once; the metrics tests, which
/// have no OpenTelemetry layer, read the same W3C headers through it).
fn install_propagator() {
    static ONCE: OnceLock<()> = OnceLock::new();
    ONCE.get_or_init(|| opentelemetry::global::set_text_map_propagator(MarkingPropagator::default()));
}

/// The in-memory exporter behind the binary's `tracing-opentelemetry` layer (installed
/// at the first call, with the propagator). Every test calls it first, directly or
/// through `recorder::install`: a span opened before the subscriber exists is never
/// recorded.
pub fn tracing_to_memory() -> InMemorySpanExporter {
    static EXPORTER: OnceLock<(InMemorySpanExporter, SdkTracerProvider)> = OnceLock::new();
    install_propagator();
    let (exporter, _) = EXPORTER.get_or_init(|| {
        let exporter = InMemorySpanExporter::default();
        let provider = SdkTracerProvider::builder()
            .with_simple_exporter(exporter.clone())
            .build();
        let tracer = provider.tracer("courier-tests");
        let subscriber = tracing_subscriber::registry().with(tracing_opentelemetry::layer().with_tracer(tracer));
        tracing::subscriber::set_global_default(subscriber).expect("the only subscriber of this binary");
        (exporter, provider)
    });
    exporter.clone()
}

/// The finished spans of trace `trace`.
fn spans_of(exporter: &InMemorySpanExporter, trace: TraceId) -> Vec<SpanData> {
    exporter
        .get_finished_spans()
        .unwrap()
        .into_iter()
        .filter(|s| s.span_context.trace_id() == trace)
        .collect()
}

fn named<'a>(spans: &'a [SpanData], name: &str) -> Vec<&'a SpanData> {
    spans.iter().filter(|s| s.name == name).collect()
}

fn one<'a>(spans: &'a [SpanData], name: &str) -> &'a SpanData {
    let found = named(spans, name);
    assert_eq!(found.len(), 1, "one span {name:?} in {:#?}", names(spans));
    found[0]
}

fn names(spans: &[SpanData]) -> Vec<String> {
    let mut n: Vec<String> = spans.iter().map(|s| s.name.to_string()).collect();
    n.sort();
    n
}

fn attribute(span: &SpanData, key: &str) -> Option<String> {
    span.attributes
        .iter()
        .find(|kv| kv.key.as_str() == key)
        .map(|kv| kv.value.to_string())
}

fn assert_child(child: &SpanData, parent: &SpanData) {
    assert_eq!(
        child.parent_span_id,
        parent.span_context.span_id(),
        "{} is a child of {}",
        child.name,
        parent.name
    );
}

#[derive(Debug, Serialize, Deserialize, courier::Message)]
#[message(name = "otel.PlaceOrder")]
struct PlaceOrder {
    order: String,
}

#[derive(Debug, Serialize, Deserialize, courier::Message)]
#[message(name = "otel.ChargeCard")]
struct ChargeCard {
    order: String,
}

#[derive(Debug, Serialize, Deserialize, courier::Message)]
#[message(name = "otel.PaymentDue")]
struct PaymentDue;

#[derive(Debug, Default, Serialize, Deserialize)]
struct Order {
    order: String,
}

#[courier::saga(name = "otel.Order")]
impl Order {
    #[start(by = order)]
    async fn placed(&mut self, msg: PlaceOrder, ctx: &mut SagaContext<'_>) -> Result<(), HandlerError> {
        self.order = msg.order.clone();
        ctx.send(&ChargeCard { order: msg.order })?;
        ctx.request_timeout(Duration::from_secs(600), &PaymentDue)?;
        Ok(())
    }

    #[timeout]
    async fn payment_due(&mut self, _t: PaymentDue, ctx: &mut SagaContext<'_>) -> Result<(), HandlerError> {
        ctx.complete();
        Ok(())
    }
}

/// What the card endpoint saw of each message: its headers and its handling's trace
/// position.
#[derive(Default)]
struct Seen(Mutex<Vec<(courier::Properties, courier::TraceContext)>>);

#[courier::handler]
async fn charge(_msg: ChargeCard, ctx: &mut Context) -> Result<(), HandlerError> {
    let seen = (ctx.received().envelope.properties.clone(), ctx.trace());
    ctx.state::<Arc<Seen>>()?.0.lock().unwrap().push(seen);
    Ok(())
}

fn text(p: &courier::Properties, key: &str) -> Option<String> {
    match p.get(key) {
        Some(PropertyValue::String(s)) => Some(s.clone()),
        _ => None,
    }
}

#[tokio::test]
async fn one_trace_covers_two_endpoints_and_a_saga_timeout() {
    let exporter = tracing_to_memory();
    let orders = TestEndpoint::start("otel-orders", |e| {
        e.routes(Routes::new().send::<ChargeCard>("otel-cards")).saga::<Order>()
    })
    .await
    .unwrap();
    let seen = Arc::new(Seen::default());
    let clock: Arc<dyn Clock> = Arc::new(orders.clock().clone());
    let cards = Endpoint::builder("otel-cards")
        .transport(Arc::new(orders.broker().clone()))
        .clock(clock)
        .routes(Routes::new())
        .state(seen.clone())
        .handler(charge)
        .start()
        .await
        .unwrap();

    // An HTTP request's span, as a web framework's tracing layer would open it.
    let request = tracing::info_span!("request", otel.name = "POST /orders", otel.kind = "server");
    let trace = request.context().span().span_context().trace_id();
    orders
        .send(&PlaceOrder { order: "o-1".into() })
        .instrument(request.clone())
        .await
        .unwrap();
    drop(request);
    eventually("the card endpoint handled the charge", || async {
        cards.stats().completed == 1
    })
    .await;
    orders.advance(Duration::from_secs(600)).await.unwrap();
    orders.shutdown().await.unwrap();
    cards.shutdown().await.unwrap();

    let spans = spans_of(&exporter, trace);
    let handle_charge = format!("handle {}::charge", module_path!());
    assert_eq!(
        names(&spans),
        [
            "POST /orders",
            "create otel-cards",
            "create otel-orders",
            handle_charge.as_str(),
            "process otel-cards",
            "process otel-orders",
            "process otel-orders",
            "saga otel.Order",
            "send otel-orders",
            "timeout otel.Order",
        ],
        "every span of both endpoints and of the timeout is in the request's trace"
    );
    let request = one(&spans, "POST /orders");
    assert_eq!(request.parent_span_id, SpanId::INVALID, "the request is the root");
    let send = one(&spans, "send otel-orders");
    assert_child(send, request);
    assert_eq!(send.span_kind, SpanKind::Producer);
    let processes = named(&spans, "process otel-orders");
    let placed = processes
        .iter()
        .find(|p| p.parent_span_id == send.span_context.span_id())
        .expect("the order's processing is a child of its send");
    assert_eq!(placed.span_kind, SpanKind::Consumer);
    assert!(placed.parent_span_is_remote, "its parent came in the message's headers");
    let saga = one(&spans, "saga otel.Order");
    assert_child(saga, placed);
    assert_eq!(attribute(saga, "courier.saga.correlation").as_deref(), Some("o-1"));

    // Endpoint A's saga sent to endpoint B.
    let create_charge = one(&spans, "create otel-cards");
    assert_child(create_charge, saga);
    assert_eq!(create_charge.span_kind, SpanKind::Producer);
    let charged = one(&spans, "process otel-cards");
    assert_child(charged, create_charge);
    let handle = one(&spans, &handle_charge);
    assert_child(handle, charged);
    assert_eq!(attribute(charged, "messaging.system").as_deref(), Some("embedded"));
    assert_eq!(
        attribute(charged, "messaging.destination.name").as_deref(),
        Some("otel-cards")
    );
    assert_eq!(
        attribute(charged, "messaging.operation.type").as_deref(),
        Some("process")
    );
    assert_eq!(
        attribute(charged, "courier.message.type").as_deref(),
        Some("otel.ChargeCard")
    );
    assert_eq!(
        attribute(charged, "messaging.message.id"),
        attribute(create_charge, "messaging.message.id"),
        "the consumer and producer spans name the same message"
    );

    // The saga's timeout, sent to itself and handled 600 s (virtual) later.
    let create_timeout = one(&spans, "create otel-orders");
    assert_child(create_timeout, saga);
    let fired = processes
        .iter()
        .find(|p| p.parent_span_id == create_timeout.span_context.span_id())
        .expect("the timeout's processing is a child of its request");
    let timeout = one(&spans, "timeout otel.Order");
    assert_child(timeout, fired);

    // The headers came from the installed propagator, and the handler's trace position
    // is its OpenTelemetry span.
    let seen = seen.0.lock().unwrap();
    assert_eq!(seen.len(), 1);
    let (headers, position) = &seen[0];
    assert_eq!(
        text(headers, TRACEPARENT),
        Some(format!("00-{}-{}-01", trace, create_charge.span_context.span_id()))
    );
    assert_eq!(
        text(headers, MARK),
        Some(create_charge.span_context.span_id().to_string()),
        "the application's propagator wrote its own header too"
    );
    assert_eq!(position.trace_id(), trace.to_string());
    assert_eq!(position.span_id(), charged.span_context.span_id().to_string());
}

#[tokio::test]
async fn a_message_from_a_foreign_producer_continues_its_trace() {
    let exporter = tracing_to_memory();
    let seen = Arc::new(Seen::default());
    let state = seen.clone();
    let cards = TestEndpoint::start("otel-foreign", |e| e.routes(Routes::new()).state(state).handler(charge))
        .await
        .unwrap();
    let producer_trace = "0af7651916cd43dd8448eb211c80319c";
    let producer_span = "b7ad6b7169203331";
    let envelope = ChargeCard { order: "o-2".into() }
        .to_envelope()
        .unwrap()
        .with_property(TRACEPARENT, format!("00-{producer_trace}-{producer_span}-01"))
        .with_property(courier::TRACESTATE, "vendor=abc");
    let id = envelope.message_id.clone();
    cards
        .endpoint()
        .bus()
        .send_envelope("otel-foreign", envelope)
        .await
        .unwrap();
    cards.settle().await.unwrap();
    cards.shutdown().await.unwrap();

    let trace = TraceId::from_hex(producer_trace).unwrap();
    let spans = spans_of(&exporter, trace);
    let handle_charge = format!("handle {}::charge", module_path!());
    assert_eq!(names(&spans), [handle_charge.as_str(), "process otel-foreign"]);
    let process = one(&spans, "process otel-foreign");
    assert_eq!(process.parent_span_id, SpanId::from_hex(producer_span).unwrap());
    assert!(process.parent_span_is_remote);
    assert_eq!(process.span_context.trace_state().header(), "vendor=abc");
    assert_eq!(attribute(process, "messaging.message.id"), Some(id));
    assert_child(one(&spans, &handle_charge), process);
    let seen = seen.0.lock().unwrap();
    assert_eq!(
        seen[0].1.trace_id(),
        producer_trace,
        "the handler's position is in the same trace"
    );
}

#[tokio::test]
async fn a_failed_handling_marks_its_span_as_an_error() {
    let exporter = tracing_to_memory();
    let orders = TestEndpoint::start("otel-failing", |e| e.routes(Routes::new()).handler(refuse))
        .await
        .unwrap();
    let request = tracing::info_span!("request");
    let trace = request.context().span().span_context().trace_id();
    orders
        .send(&ChargeCard { order: "o-3".into() })
        .instrument(request.clone())
        .await
        .unwrap();
    drop(request);
    orders.shutdown().await.unwrap();

    let spans = spans_of(&exporter, trace);
    let handles = named(&spans, &format!("handle {}::refuse", module_path!()));
    assert!(!handles.is_empty(), "{:?}", names(&spans));
    for h in handles {
        assert!(
            matches!(h.status, opentelemetry::trace::Status::Error { .. }),
            "{:?}",
            h.status
        );
        assert_eq!(attribute(h, "error.type").as_deref(), Some("handler"));
    }
}

#[courier::handler]
async fn refuse(_msg: ChargeCard) -> Result<(), HandlerError> {
    Err(HandlerError::permanent("the card is blocked"))
}

#[courier::handler]
async fn split(msg: PlaceOrder, ctx: &mut Context) -> Result<(), HandlerError> {
    for part in ["a", "b"] {
        ctx.send(&ChargeCard {
            order: format!("{}-{part}", msg.order),
        })?;
    }
    Ok(())
}

/// Messages a handler creates leave after its handling (here, an endpoint without a
/// store: right after it): one `dispatch` span, `send {destination}`, under the
/// processing span, with a link to the `create` span of each message it sends.
#[tokio::test]
async fn the_send_after_a_handling_is_a_span_linked_to_each_created_message() {
    let exporter = tracing_to_memory();
    let broker = courier::Embedded::builder().in_memory().open().await.unwrap();
    for q in ["otel-split", "otel-split-out"] {
        broker.create_queue(q, &courier::QueueOptions::default()).await.unwrap();
    }
    let splitter = Endpoint::builder("otel-split")
        .transport(broker.clone())
        .routes(
            Routes::new()
                .send::<PlaceOrder>("otel-split")
                .send::<ChargeCard>("otel-split-out"),
        )
        .handler(split)
        .start()
        .await
        .unwrap();
    let request = tracing::info_span!("request", otel.name = "POST /split", otel.kind = "server");
    let trace = request.context().span().span_context().trace_id();
    splitter
        .bus()
        .send(&PlaceOrder { order: "o-9".into() })
        .instrument(request.clone())
        .await
        .unwrap();
    drop(request);
    eventually("the split was handled", || async { splitter.stats().completed == 1 }).await;
    splitter.shutdown().await.unwrap();

    let spans = spans_of(&exporter, trace);
    let process = one(&spans, "process otel-split");
    let creates = named(&spans, "create otel-split-out");
    assert_eq!(creates.len(), 2, "{:?}", names(&spans));
    let dispatch = one(&spans, "send otel-split-out");
    assert_child(dispatch, process);
    assert_eq!(dispatch.span_kind, SpanKind::Producer);
    assert_eq!(
        attribute(dispatch, "messaging.batch.message_count").as_deref(),
        Some("2")
    );
    assert_eq!(
        attribute(dispatch, "messaging.destination.name").as_deref(),
        Some("otel-split-out")
    );
    let mut linked: Vec<String> = dispatch
        .links
        .iter()
        .map(|l| l.span_context.span_id().to_string())
        .collect();
    let mut created: Vec<String> = creates.iter().map(|c| c.span_context.span_id().to_string()).collect();
    linked.sort();
    created.sort();
    assert_eq!(
        linked, created,
        "the dispatch links the create span of each message it sends"
    );
}
