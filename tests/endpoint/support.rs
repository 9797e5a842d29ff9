//! Test handlers and waiting helpers for the endpoint tests.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use courier::conformance::Fixture;
use courier::{
    BoxFuture, Clock, Context, Endpoint, EndpointBuilder, EntityCounts, EntityPath, Handler, HandlerError, Message,
    ReceivedMessage, Routes, RunningEndpoint, Transport,
};
pub use courier_tests::eventually;
use serde::{Deserialize, Serialize};

/// A command.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, courier::Message)]
#[message(name = "test.PlaceOrder")]
pub struct PlaceOrder {
    pub id: u32,
}

/// An event.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, courier::Message)]
#[message(name = "test.OrderPlaced")]
pub struct OrderPlaced {
    pub id: u32,
}

/// A type renamed from `test.OldPing`: messages under the old name are still handled.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, courier::Message)]
#[message(name = "test.Ping", aliases = ["test.OldPing"])]
pub struct Ping {
    pub n: u32,
}

/// What a handler saw on one call.
#[derive(Debug, Clone)]
pub struct Call {
    pub handler: &'static str,
    pub message_id: String,
    pub correlation_id: Option<String>,
    pub causation_id: Option<String>,
    pub message_type: Option<String>,
    pub sequence_number: i64,
    pub delivery_count: u32,
    pub attempt: u32,
    pub delayed_retries: u32,
    pub trace_id: String,
    pub span_id: String,
    pub traceparent: Option<String>,
    pub payload: String,
}

/// Records calls, shared by a test and its handlers.
#[derive(Clone, Default)]
pub struct Calls(Arc<Mutex<Vec<Call>>>);

impl Calls {
    pub fn record(&self, handler: &'static str, ctx: &Context, payload: String) {
        let traceparent = match ctx.header(courier::TRACEPARENT) {
            Some(courier::PropertyValue::String(s)) => Some(s.clone()),
            _ => None,
        };
        self.0.lock().unwrap().push(Call {
            handler,
            message_id: ctx.message_id().to_owned(),
            correlation_id: ctx.correlation_id().map(str::to_owned),
            causation_id: ctx.causation_id().map(str::to_owned),
            message_type: ctx.message_type().map(str::to_owned),
            sequence_number: ctx.sequence_number(),
            delivery_count: ctx.delivery_count(),
            attempt: ctx.attempt(),
            delayed_retries: ctx.delayed_retries(),
            trace_id: ctx.trace().trace_id(),
            span_id: ctx.trace().span_id(),
            traceparent,
            payload,
        });
    }
    pub fn all(&self) -> Vec<Call> {
        self.0.lock().unwrap().clone()
    }
    pub fn len(&self) -> usize {
        self.0.lock().unwrap().len()
    }
    pub fn of(&self, handler: &str) -> Vec<Call> {
        self.all().into_iter().filter(|c| c.handler == handler).collect()
    }
}

type Body<M> = dyn Fn(M, &mut Context) -> BoxFuture<'static, Result<(), HandlerError>> + Send + Sync;

/// A handler made of a closure: it runs the synchronous part with the context and then
/// awaits the future it returns.
pub struct FnHandler<M> {
    name: &'static str,
    body: Arc<Body<M>>,
}

impl<M: Message> Handler for FnHandler<M> {
    type Message = M;
    fn name(&self) -> &'static str {
        self.name
    }
    fn handle<'a>(&'a self, message: M, ctx: &'a mut Context) -> BoxFuture<'a, Result<(), HandlerError>> {
        (self.body)(message, ctx)
    }
}

pub fn handler_fn<M: Message>(
    name: &'static str,
    body: impl Fn(M, &mut Context) -> BoxFuture<'static, Result<(), HandlerError>> + Send + Sync + 'static,
) -> FnHandler<M> {
    FnHandler {
        name,
        body: Arc::new(body),
    }
}

/// A handler that records every call and succeeds.
pub fn recording<M: Message + std::fmt::Debug>(name: &'static str, calls: &Calls) -> FnHandler<M> {
    let calls = calls.clone();
    handler_fn(name, move |m: M, ctx: &mut Context| {
        calls.record(name, ctx, format!("{m:?}"));
        Box::pin(async { Ok(()) })
    })
}

/// A handler that records the call and then waits for a permit of `gate`.
pub fn gated<M: Message + std::fmt::Debug>(
    name: &'static str,
    calls: &Calls,
    gate: &Arc<tokio::sync::Semaphore>,
) -> FnHandler<M> {
    let (calls, gate) = (calls.clone(), gate.clone());
    handler_fn(name, move |m: M, ctx: &mut Context| {
        calls.record(name, ctx, format!("{m:?}"));
        let gate = gate.clone();
        Box::pin(async move {
            if let Ok(permit) = gate.acquire().await {
                permit.forget();
            }
            Ok(())
        })
    })
}

pub fn ok() -> BoxFuture<'static, Result<(), HandlerError>> {
    Box::pin(async { Ok(()) })
}

pub fn fail(e: HandlerError) -> BoxFuture<'static, Result<(), HandlerError>> {
    Box::pin(async move { Err(e) })
}

pub async fn fixture() -> Fixture {
    courier_tests::embedded_fixture().await
}

/// The routes of the endpoint tests.
pub fn routes() -> Routes {
    Routes::new()
        .send::<PlaceOrder>("sales")
        .send::<Ping>("pings")
        .event::<OrderPlaced>()
}

/// An endpoint on the fixture's broker and clock, with the test routes.
pub fn endpoint(fx: &Fixture, name: &str) -> EndpointBuilder {
    let clock: Arc<dyn Clock> = Arc::new(fx.clock.clone());
    Endpoint::builder(name)
        .transport(fx.transport.clone())
        .clock(clock)
        .routes(routes())
        .shutdown_timeout(Duration::from_secs(10))
}

/// Starts an endpoint with one handler and the defaults.
pub async fn start<H: Handler>(fx: &Fixture, name: &str, handler: H) -> RunningEndpoint {
    endpoint(fx, name).handler(handler).start().await.unwrap()
}

pub async fn counts(transport: &Arc<dyn Transport>, queue: &str) -> EntityCounts {
    transport.counts(&EntityPath::queue(queue)).await.unwrap()
}

pub async fn wait_counts(transport: &Arc<dyn Transport>, queue: &str, want: impl Fn(&EntityCounts) -> bool) {
    eventually(&format!("counts of {queue}"), || async {
        want(&counts(transport, queue).await)
    })
    .await;
}

pub async fn dead_letters(transport: &Arc<dyn Transport>, queue: &str) -> Vec<ReceivedMessage> {
    transport
        .peek(&EntityPath::queue(queue).dead_letter(), 0, 100)
        .await
        .unwrap()
}

pub fn string_prop(m: &ReceivedMessage, key: &str) -> String {
    match m.envelope.properties.get(key) {
        Some(courier::PropertyValue::String(s)) => s.clone(),
        other => panic!("property {key} is {other:?}"),
    }
}

pub fn int_prop(m: &ReceivedMessage, key: &str) -> i64 {
    match m.envelope.properties.get(key) {
        Some(courier::PropertyValue::Int(n)) => *n,
        other => panic!("property {key} is {other:?}"),
    }
}

/// Advances the virtual clock once the broker holds `scheduled` scheduled messages.
pub async fn advance_when_scheduled(fx: &Fixture, queue: &str, scheduled: u64, by: Duration) {
    wait_counts(&fx.transport, queue, |c| c.scheduled == scheduled && c.active == 0).await;
    fx.clock.advance(by);
}
