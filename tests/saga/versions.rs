//! Issue 13, point 9: message versions and saga state versions, on the three stores.
//! Messages of older wire shapes are sent as raw envelopes through the transport (a
//! version header of 1 or 2, or none); saga rows of the old shape are inserted with SQL,
//! as an earlier deploy left them. Both are brought up to date and handled; versions this
//! code cannot read are dead-lettered at once, with the reason, and never decoded wrongly.

use std::sync::Arc;

use courier::recoverability::reasons as failure_reasons;
use courier::saga::SagaContext;
use courier::saga::reasons as saga_reasons;
use courier::serde_json::{Value, json};
use courier::version::headers::MESSAGE_VERSION;
use courier::{
    Clock, Endpoint, EntityPath, Envelope, HandlerError, Message as _, PropertyValue, QueueOptions, Routes,
    RunningEndpoint, SenderOptions, UpcastError,
};
use courier_tests::eventually;
use courier_tests::stores::{StoreEnv, StoreKind};
use serde::{Deserialize, Serialize};

/// Version 1: `{"order": "o-1", "total_cents": 1250}`; version 2 renamed `order` to
/// `order_id`; version 3 renamed `total_cents` to `cents` and added the currency. Once
/// called `versions.OrderSubmitted`.
#[derive(Debug, Clone, Serialize, Deserialize, courier::Message)]
#[message(
    name = "versions.OrderPlaced",
    aliases = ["versions.OrderSubmitted"],
    version = 3,
    upcast = Self::upcast
)]
struct OrderPlaced {
    order_id: String,
    cents: u64,
    currency: String,
}

/// Renames `from` to `to` in a JSON object; a missing field is the error `missing`.
fn rename(value: &mut Value, from: &str, to: &str, missing: &'static str) -> Result<(), UpcastError> {
    let object = value
        .as_object_mut()
        .ok_or_else(|| UpcastError::invalid("not an object"))?;
    let field = object.remove(from).ok_or_else(|| UpcastError::invalid(missing))?;
    object.insert(to.to_owned(), field);
    Ok(())
}

impl OrderPlaced {
    fn upcast(from: u32, mut body: Value) -> Result<Value, UpcastError> {
        match from {
            1 => rename(&mut body, "order", "order_id", "a version-1 OrderPlaced has an `order`")?,
            2 => {
                rename(
                    &mut body,
                    "total_cents",
                    "cents",
                    "a version-2 OrderPlaced has `total_cents`",
                )?;
                body["currency"] = json!("EUR");
            }
            _ => return Err(UpcastError::unsupported(from)),
        }
        Ok(body)
    }
}

/// Version 2 added the payment method; version 1 is not read any more (no upcaster).
#[derive(Debug, Clone, Serialize, Deserialize, courier::Message)]
#[message(name = "versions.OrderPaid", version = 2)]
struct OrderPaid {
    order_id: String,
    method: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, courier::Message)]
#[message(name = "versions.ShipOrder", version = 2)]
struct ShipOrder {
    order_id: String,
    cents: u64,
    currency: String,
}

/// Version 1 of the state: `{"order": "o-1", "total_cents": 1250}`.
#[derive(Debug, Default, Serialize, Deserialize)]
struct Order {
    order_id: String,
    cents: u64,
    currency: String,
    paid: bool,
}

#[courier::saga(name = "versions.Order", version = 2, migrate = Self::migrate)]
impl Order {
    #[start(by = order_id)]
    async fn placed(&mut self, msg: OrderPlaced) -> Result<(), HandlerError> {
        self.order_id = msg.order_id;
        self.cents = msg.cents;
        self.currency = msg.currency;
        Ok(())
    }

    #[handle(by = order_id)]
    async fn paid(&mut self, _msg: OrderPaid, ctx: &mut SagaContext<'_>) -> Result<(), HandlerError> {
        self.paid = true;
        ctx.send(&ShipOrder {
            order_id: self.order_id.clone(),
            cents: self.cents,
            currency: self.currency.clone(),
        })?;
        Ok(())
    }

    fn migrate(from: u32, mut state: Value) -> Result<Value, UpcastError> {
        match from {
            1 => {
                rename(&mut state, "order", "order_id", "a version-1 Order has an `order`")?;
                rename(
                    &mut state,
                    "total_cents",
                    "cents",
                    "a version-1 Order has `total_cents`",
                )?;
                state["currency"] = json!("EUR");
                state["paid"] = json!(false);
                Ok(state)
            }
            _ => Err(UpcastError::unsupported(from)),
        }
    }
}

struct Shop {
    env: StoreEnv,
    orders: RunningEndpoint,
}

impl Shop {
    /// The endpoint keeps the default retry policy: a failure that were not permanent
    /// would wait for a delayed retry (the virtual clock never moves here), so a message
    /// that reaches the dead-letter queue went there at once.
    async fn open(kind: StoreKind) -> Self {
        let env = StoreEnv::new(kind).await;
        env.fx
            .transport
            .create_queue("shipping", &QueueOptions::default())
            .await
            .unwrap();
        let routes = Routes::new()
            .send::<OrderPlaced>("orders")
            .send::<OrderPaid>("orders")
            .send::<ShipOrder>("shipping");
        let clock: Arc<dyn Clock> = Arc::new(env.fx.clock.clone());
        let orders = Endpoint::builder("orders")
            .transport(env.fx.transport.clone())
            .clock(clock)
            .routes(routes)
            .store(env.store.clone())
            .saga::<Order>()
            .start()
            .await
            .unwrap();
        Self { env, orders }
    }

    async fn settled(&self, before: courier::EndpointStats) {
        eventually("the message handled", || async {
            let now = self.orders.stats();
            now.completed + now.dead_lettered > before.completed + before.dead_lettered && now.running == 0
        })
        .await;
    }

    async fn handle<M: courier::Message>(&self, message: &M) {
        let before = self.orders.stats();
        self.orders.bus().send(message).await.unwrap();
        self.settled(before).await;
    }

    /// Sends a body as an older producer did: a raw envelope of `message_type` with the
    /// version header `version` (none: an unversioned producer). Returns its message id.
    async fn handle_raw(&self, message_type: &str, version: Option<PropertyValue>, body: &Value) -> String {
        let mut envelope = Envelope::json(body).unwrap().with_message_type(message_type);
        if let Some(v) = version {
            envelope = envelope.with_property(MESSAGE_VERSION, v);
        }
        self.handle_envelope(envelope).await
    }

    /// Sends an envelope to the endpoint's queue as it is and waits for its outcome.
    async fn handle_envelope(&self, envelope: Envelope) -> String {
        let id = envelope.message_id.clone();
        let before = self.orders.stats();
        let sender = self
            .env
            .fx
            .transport
            .sender("orders", SenderOptions::default())
            .await
            .unwrap();
        sender.send(envelope).await.unwrap();
        self.settled(before).await;
        id
    }

    /// Inserts a saga row as an earlier deploy stored it (`state_version` `None`: before
    /// the column existed, so its default).
    async fn insert_row(&self, correlation: &str, state: &Value, state_version: Option<i64>) {
        let table = self.env.kind.table("saga");
        let (columns, version) = match state_version {
            Some(v) => (", state_version", format!(", {v}")),
            None => ("", String::new()),
        };
        let (state, now) = if self.env.kind.postgres() {
            (format!("'{state}'::jsonb"), "now()")
        } else {
            (format!("'{state}'"), "0")
        };
        self.env
            .exec(&format!(
                "INSERT INTO {table} (saga_type, correlation, state, version, created_at, updated_at{columns}) \
                 VALUES ('versions.Order', '{correlation}', {state}, 1, {now}, {now}{version})"
            ))
            .await;
    }

    /// The stored state of an instance, its state version and its (concurrency) version.
    async fn row(&self, correlation: &str) -> (Value, i64, i64) {
        let table = self.env.kind.table("saga");
        let state = if self.env.kind.postgres() {
            "state::text"
        } else {
            "state"
        };
        let text = self
            .env
            .text(&format!(
                "SELECT {state} FROM {table} WHERE correlation = '{correlation}'"
            ))
            .await
            .expect("the instance");
        let state_version = self
            .env
            .count(&format!(
                "SELECT state_version FROM {table} WHERE correlation = '{correlation}'"
            ))
            .await;
        let version = self
            .env
            .count(&format!(
                "SELECT version FROM {table} WHERE correlation = '{correlation}'"
            ))
            .await;
        (serde_json::from_str(&text).unwrap(), state_version, version)
    }

    /// The messages in the shipping queue.
    async fn shipped(&self) -> Vec<Envelope> {
        self.env
            .fx
            .transport
            .peek(&EntityPath::queue("shipping"), 0, 100)
            .await
            .unwrap()
            .into_iter()
            .map(|m| m.envelope)
            .collect()
    }

    /// The dead letter of message `id`: its reason and description.
    async fn dead_letter(&self, id: &str) -> (String, String) {
        let dead = self
            .env
            .fx
            .transport
            .peek(&EntityPath::queue("orders").dead_letter(), 0, 100)
            .await
            .unwrap();
        let m = dead
            .into_iter()
            .find(|m| m.envelope.message_id == id)
            .unwrap_or_else(|| panic!("message {id} dead-lettered"));
        (
            m.broker.dead_letter_reason.unwrap_or_default(),
            m.broker.dead_letter_description.unwrap_or_default(),
        )
    }

    async fn finish(self) {
        self.orders.shutdown().await.unwrap();
        self.env.finish().await;
    }
}

fn paid(order_id: &str) -> OrderPaid {
    OrderPaid {
        order_id: order_id.into(),
        method: "card".into(),
    }
}

/// Bodies of versions 1 and 2 (with no header, with the header as an integer or as a
/// producer's text, under the type's earlier name too) are upcast and start their
/// instances as a current one does; each instance is stored at the state's version.
async fn old_messages_are_upcast_and_handled(kind: StoreKind) {
    let shop = Shop::open(kind).await;
    let v1 = json!({"order": "o-1", "total_cents": 1250});
    shop.handle_raw("versions.OrderPlaced", None, &v1).await;
    let v2 = json!({"order_id": "o-2", "total_cents": 990});
    shop.handle_raw("versions.OrderPlaced", Some(PropertyValue::Int(2)), &v2)
        .await;
    let renamed = json!({"order": "o-3", "total_cents": 5});
    shop.handle_raw("versions.OrderSubmitted", Some("1".into()), &renamed)
        .await;
    shop.handle(&OrderPlaced {
        order_id: "o-4".into(),
        cents: 100,
        currency: "USD".into(),
    })
    .await;
    assert_eq!(shop.orders.stats().dead_lettered, 0);
    for (id, cents, currency) in [
        ("o-1", 1250, "EUR"),
        ("o-2", 990, "EUR"),
        ("o-3", 5, "EUR"),
        ("o-4", 100, "USD"),
    ] {
        let (state, state_version, _) = shop.row(id).await;
        assert_eq!(
            state,
            json!({"order_id": id, "cents": cents, "currency": currency, "paid": false}),
            "{id}"
        );
        assert_eq!(state_version, 2, "{id}: stored at the saga's version");
    }

    // What the saga sends carries its type's version.
    shop.handle(&paid("o-1")).await;
    let shipped = shop.shipped().await;
    assert_eq!(shipped.len(), 1);
    assert_eq!(shipped[0].properties.get(MESSAGE_VERSION), Some(&PropertyValue::Int(2)));
    let body: ShipOrder = serde_json::from_slice(&shipped[0].body).unwrap();
    assert_eq!(
        body,
        ShipOrder {
            order_id: "o-1".into(),
            cents: 1250,
            currency: "EUR".into()
        }
    );
    shop.finish().await;
}

/// Saga rows of the old shape, one stored before the version column existed and one at
/// version 1, are migrated when loaded, handled, and saved at version 2 in the new shape.
async fn old_saga_states_are_migrated_and_saved_at_the_current_version(kind: StoreKind) {
    let shop = Shop::open(kind).await;
    shop.insert_row("o-7", &json!({"order": "o-7", "total_cents": 1250}), None)
        .await;
    shop.insert_row("o-8", &json!({"order": "o-8", "total_cents": 40}), Some(1))
        .await;
    assert_eq!(shop.row("o-7").await.1, 1, "the column's default");
    shop.handle(&paid("o-7")).await;
    shop.handle(&paid("o-8")).await;
    assert_eq!(shop.orders.stats().dead_lettered, 0);
    let shipped: Vec<ShipOrder> = shop
        .shipped()
        .await
        .iter()
        .map(|e| serde_json::from_slice(&e.body).unwrap())
        .collect();
    assert_eq!(
        shipped,
        vec![
            ShipOrder {
                order_id: "o-7".into(),
                cents: 1250,
                currency: "EUR".into()
            },
            ShipOrder {
                order_id: "o-8".into(),
                cents: 40,
                currency: "EUR".into()
            }
        ],
        "the handler read the migrated state"
    );
    for (id, cents) in [("o-7", 1250), ("o-8", 40)] {
        let (state, state_version, version) = shop.row(id).await;
        assert_eq!(
            state,
            json!({"order_id": id, "cents": cents, "currency": "EUR", "paid": true}),
            "{id}"
        );
        assert_eq!((state_version, version), (2, 2), "{id}: saved in the new shape");
    }
    shop.finish().await;
}

/// What this code cannot read goes to the dead-letter queue at once with the reason: a
/// message newer than its type, one older with no upcaster step, a version header that
/// is not one, a saga state newer than the saga (left as it is), and a state the
/// migration refuses.
async fn unreadable_versions_are_dead_lettered_at_once(kind: StoreKind) {
    let shop = Shop::open(kind).await;
    let newer = shop
        .handle_raw(
            "versions.OrderPlaced",
            Some(PropertyValue::Int(4)),
            &json!({"order_id": "o-10", "cents": 1, "currency": "EUR", "gift": true}),
        )
        .await;
    let (reason, description) = shop.dead_letter(&newer).await;
    assert_eq!(reason, failure_reasons::UNSUPPORTED_MESSAGE_VERSION);
    assert!(
        description.contains("version 4") && description.contains("versions up to 3"),
        "{description}"
    );

    let garbled = shop
        .handle_raw("versions.OrderPlaced", Some("three".into()), &json!({}))
        .await;
    let (reason, description) = shop.dead_letter(&garbled).await;
    assert_eq!(reason, failure_reasons::UNSUPPORTED_MESSAGE_VERSION);
    assert!(description.contains("not a version"), "{description}");

    shop.handle(&OrderPlaced {
        order_id: "o-11".into(),
        cents: 7,
        currency: "EUR".into(),
    })
    .await;
    let unversioned = shop
        .handle_raw("versions.OrderPaid", None, &json!({"order_id": "o-11"}))
        .await;
    let (reason, description) = shop.dead_letter(&unversioned).await;
    assert_eq!(reason, failure_reasons::UNSUPPORTED_MESSAGE_VERSION);
    assert!(
        description.contains("version 1") && description.contains("no step from version 1 to 2"),
        "{description}"
    );
    assert!(!shop.row("o-11").await.0["paid"].as_bool().unwrap(), "not handled");

    let future = json!({"order_id": "o-12", "lines": [{"sku": "a", "cents": 3}]});
    shop.insert_row("o-12", &future, Some(3)).await;
    let id = shop.handle_envelope(paid("o-12").to_envelope().unwrap()).await;
    let (reason, description) = shop.dead_letter(&id).await;
    assert_eq!(reason, saga_reasons::UNSUPPORTED_STATE_VERSION);
    assert!(
        description.contains("version 3") && description.contains("newer than this code"),
        "{description}"
    );
    assert_eq!(shop.row("o-12").await, (future, 3, 1), "the row is left as it was");

    shop.insert_row("o-13", &json!({"total_cents": 3}), Some(1)).await;
    let id = shop.handle_envelope(paid("o-13").to_envelope().unwrap()).await;
    let (reason, description) = shop.dead_letter(&id).await;
    assert_eq!(reason, saga_reasons::UNSUPPORTED_STATE_VERSION);
    assert!(
        description.contains("cannot be migrated from version 1 to 2")
            && description.contains("a version-1 Order has an `order`"),
        "{description}"
    );

    let stats = shop.orders.stats();
    assert_eq!(stats.dead_lettered, 5);
    assert!(shop.shipped().await.is_empty(), "nothing was handled wrongly");
    shop.finish().await;
}

on_every_store!(
    old_messages_are_upcast_and_handled,
    old_saga_states_are_migrated_and_saved_at_the_current_version,
    unreadable_versions_are_dead_lettered_at_once,
);
