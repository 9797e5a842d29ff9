//! How a saga joins an endpoint: `EndpointBuilder::saga` and `saga_with` (defined here, on
//! the endpoint's builder) wrap the saga type and its options in a [`Registering`], the
//! saga module's implementation of the seam the endpoint defines
//! (`endpoint::sagas::SagaRegistration`). The endpoint then takes the saga's name, what it
//! declared it sends and its handlers without naming this module.

use std::marker::PhantomData;
use std::sync::Arc;

use super::{Saga, SagaOptions, runtime};
use crate::endpoint::EndpointBuilder;
use crate::endpoint::handler::Declared;
use crate::endpoint::sagas::{Registered, SagaRegistration, SagaStats};

/// A saga type with its options, ready to be added to an endpoint.
struct Registering<S> {
    options: SagaOptions,
    saga: PhantomData<fn() -> S>,
}

impl<S: Saga> SagaRegistration for Registering<S> {
    fn name(&self) -> &'static str {
        S::NAME
    }

    fn declared(&self) -> Declared {
        S::declared()
    }

    fn handlers(self, stats: Arc<SagaStats>) -> Result<Vec<Registered>, String> {
        runtime::register::<S>(self.options, stats)
    }
}

impl EndpointBuilder {
    /// Adds a saga with the default options (see [`saga_with`](Self::saga_with)). The
    /// endpoint needs a [`store`](Self::store).
    pub fn saga<S: Saga>(self) -> Self {
        self.saga_with::<S>(SagaOptions::default())
    }

    /// Adds a saga: its handlers join the endpoint's (a message type handled by the saga
    /// and by plain handlers runs them all), its instances and timeouts live in the
    /// endpoint's store, and the endpoint dispatches its timeouts when due.
    pub fn saga_with<S: Saga>(self, options: SagaOptions) -> Self {
        self.add_saga(Registering::<S> {
            options,
            saga: PhantomData,
        })
    }
}
