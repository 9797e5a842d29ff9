//! A tracing layer that records spans and events, for assertions.

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::sync::{Arc, Mutex};

use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::layer::{Context, SubscriberExt};
use tracing_subscriber::registry::LookupSpan;

pub type Fields = BTreeMap<String, String>;

#[derive(Debug, Clone)]
pub struct CapturedEvent {
    pub level: Level,
    pub message: String,
    pub fields: Fields,
    pub span: Option<String>,
}

#[derive(Default)]
struct Inner {
    spans: Vec<(u64, String, Fields)>,
    events: Vec<CapturedEvent>,
}

#[derive(Clone, Default)]
pub struct Capture(Arc<Mutex<Inner>>);

struct Visitor<'a>(&'a mut Fields);

impl Visit for Visitor<'_> {
    fn record_debug(&mut self, field: &Field, value: &dyn Debug) {
        self.0.insert(field.name().to_owned(), format!("{value:?}"));
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().to_owned(), value.to_owned());
    }
}

impl Capture {
    pub fn subscriber(&self) -> impl Subscriber + Send + Sync + 'static {
        tracing_subscriber::registry().with(self.clone())
    }
    pub fn spans(&self, name: &str) -> Vec<Fields> {
        let inner = self.0.lock().unwrap();
        inner
            .spans
            .iter()
            .filter(|(_, n, _)| n == name)
            .map(|(_, _, f)| f.clone())
            .collect()
    }
    pub fn events(&self) -> Vec<CapturedEvent> {
        self.0.lock().unwrap().events.clone()
    }
}

impl<S: Subscriber + for<'a> LookupSpan<'a>> tracing_subscriber::Layer<S> for Capture {
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, _ctx: Context<'_, S>) {
        let mut fields = Fields::new();
        attrs.record(&mut Visitor(&mut fields));
        self.0
            .lock()
            .unwrap()
            .spans
            .push((id.into_u64(), attrs.metadata().name().to_owned(), fields));
    }
    fn on_record(&self, id: &Id, values: &Record<'_>, _ctx: Context<'_, S>) {
        let mut inner = self.0.lock().unwrap();
        if let Some((_, _, fields)) = inner.spans.iter_mut().rev().find(|(i, _, _)| *i == id.into_u64()) {
            values.record(&mut Visitor(fields));
        }
    }
    fn on_event(&self, event: &Event<'_>, ctx: Context<'_, S>) {
        let mut fields = Fields::new();
        event.record(&mut Visitor(&mut fields));
        let message = fields.remove("message").unwrap_or_default();
        let span = ctx.event_span(event).map(|s| s.name().to_owned());
        self.0.lock().unwrap().events.push(CapturedEvent {
            level: *event.metadata().level(),
            message,
            fields,
            span,
        });
    }
}
