//! What [`EndpointBuilder`](super::EndpointBuilder) accepts as its transport and store:
//! the broker itself (`broker.clone()`), an `Arc` of it, or an `Arc<dyn ..>` shared with
//! other endpoints. The conversions only wrap in an `Arc`; nothing is copied.

use std::sync::Arc;

use crate::store::Store;
use crate::transport::Transport;

/// A transport an endpoint can run on: any [`Transport`], an `Arc` of one, or an
/// `Arc<dyn Transport>`.
pub trait IntoTransport {
    /// The shared transport.
    fn into_transport(self) -> Arc<dyn Transport>;
}

impl<T: Transport> IntoTransport for T {
    fn into_transport(self) -> Arc<dyn Transport> {
        Arc::new(self)
    }
}

impl<T: Transport> IntoTransport for Arc<T> {
    fn into_transport(self) -> Arc<dyn Transport> {
        self
    }
}

impl IntoTransport for Arc<dyn Transport> {
    fn into_transport(self) -> Arc<dyn Transport> {
        self
    }
}

/// A store an endpoint can keep its inbox, outbox and sagas in: any [`Store`], an `Arc`
/// of one, or an `Arc<dyn Store>`.
pub trait IntoStore {
    /// The shared store.
    fn into_store(self) -> Arc<dyn Store>;
}

impl<S: Store> IntoStore for S {
    fn into_store(self) -> Arc<dyn Store> {
        Arc::new(self)
    }
}

impl<S: Store> IntoStore for Arc<S> {
    fn into_store(self) -> Arc<dyn Store> {
        self
    }
}

impl IntoStore for Arc<dyn Store> {
    fn into_store(self) -> Arc<dyn Store> {
        self
    }
}
