//! [`Layer`] and [`chain`]: layers put around a handler; the idempotency and ordering layers.

use std::time::Duration;

use crate::consume::{Handler, HandlerResult, OrderBy};
use crate::envelope::Message;
use crate::patterns::idempotency::IdempotencyStore;
use crate::patterns::idempotent::{idempotent, IdempotentOptions};
use crate::patterns::ordering::ordered;

/// What a handler's call ended with: its result, or its panic.
pub(super) type Ran = std::thread::Result<HandlerResult>;

/// A handler behind a box, as the chain's layers take and return it.
pub type BoxHandler = Box<dyn Handler + Send + Sync>;

/// One layer of a [`chain`]: wraps the handler inside it.
pub struct Layer {
    wrap: Box<dyn FnOnce(BoxHandler) -> BoxHandler + Send>,
}

impl Layer {
    /// A layer from any wrapping function.
    pub fn new<F>(wrap: F) -> Layer
    where
        F: FnOnce(BoxHandler) -> BoxHandler + Send + 'static,
    {
        Layer {
            wrap: Box::new(wrap),
        }
    }

    /// This layer alone around `handler`.
    pub fn around<H: Handler + Send + Sync + 'static>(self, handler: H) -> BoxHandler {
        (self.wrap)(Box::new(handler))
    }
}

impl std::fmt::Debug for Layer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Layer")
    }
}

/// `handler` wrapped in `layers`, **outermost first** (see the [module docs](crate::patterns::chain)).
pub fn chain<H, L>(handler: H, layers: L) -> Chain
where
    H: Handler + Send + Sync + 'static,
    L: IntoIterator<Item = Layer>,
{
    let layers: Vec<Layer> = layers.into_iter().collect();
    let mut composed: BoxHandler = Box::new(handler);
    // Applied innermost first, so that the first one named ends up outermost.
    for layer in layers.into_iter().rev() {
        composed = (layer.wrap)(composed);
    }
    Chain(composed)
}

/// A handler wrapped by [`chain`].
pub struct Chain(BoxHandler);

impl std::fmt::Debug for Chain {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Chain")
            .field("ordering", &self.0.ordering())
            .finish()
    }
}

impl Handler for Chain {
    fn handle(&self, message: &Message) -> HandlerResult {
        self.0.handle(message)
    }
    fn ordering(&self) -> Option<&OrderBy> {
        self.0.ordering()
    }
    fn batch_limits(&self) -> Option<(usize, Duration)> {
        self.0.batch_limits()
    }
    fn handle_batch(&self, messages: &[&Message]) -> Vec<Ran> {
        self.0.handle_batch(messages)
    }
}

/// The idempotency layer: [`idempotent`](fn@idempotent) with `store`, keyed by message id.
pub fn with_idempotency<S>(store: S) -> Layer
where
    S: IdempotencyStore + 'static,
{
    Layer::new(move |inner| Box::new(idempotent(store, inner, IdempotentOptions::default())))
}

/// The ordering layer: [`ordered`] by `key`.
pub fn with_ordering<K>(key: K) -> Layer
where
    K: Fn(&Message) -> Option<String> + Send + Sync + 'static,
{
    Layer::new(move |inner| Box::new(ordered(key, inner)))
}
