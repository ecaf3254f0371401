//! Exchanges and routing: the default exchange, direct, fanout, topic (`*`, `#`), headers
//! (`x-match` all / any), the pre-declared `amq.*` exchanges; declare equivalence, delete,
//! bindings.

use super::reply::{
    access_refused, default_exchange, inequivalent, no_exchange, no_queue, not_emulated,
    precondition, same_value, Refused,
};
use super::state::{Binding, Exchange, Kind, State};
use crate::transport::{AmqpValue, ExchangeDeclareOptions, ExchangeType, FieldTable};

fn flag(b: bool) -> String {
    format!("'{b}'")
}

fn kind_of(kind: &ExchangeType) -> Refused<Kind> {
    Ok(match kind {
        ExchangeType::Direct => Kind::Direct,
        ExchangeType::Fanout => Kind::Fanout,
        ExchangeType::Topic => Kind::Topic,
        ExchangeType::Headers => Kind::Headers,
        ExchangeType::Custom(t) => return Err(not_emulated(&format!("exchange type '{t}'"))),
    })
}

/// Topic matching: `*` one word, `#` zero or more.
pub(super) fn topic_matches(pattern: &str, key: &str) -> bool {
    fn go(p: &[&str], k: &[&str]) -> bool {
        match p.split_first() {
            None => k.is_empty(),
            Some((&"#", rest)) => (0..=k.len()).any(|i| go(rest, &k[i..])),
            Some((&w, rest)) => match k.split_first() {
                Some((&kw, krest)) => (w == "*" || w == kw) && go(rest, krest),
                None => false,
            },
        }
    }
    let p: Vec<&str> = pattern.split('.').collect();
    let k: Vec<&str> = key.split('.').collect();
    go(&p, &k)
}

/// Headers matching: the binding's `x-match` (all, the default, or any) over its other
/// arguments (those starting `x-` are not matched); a void binding value matches presence.
fn headers_match(binding: &FieldTable, headers: Option<&FieldTable>) -> bool {
    let any = matches!(binding.get("x-match"), Some(AmqpValue::LongString(s)) if s == "any");
    let empty = FieldTable::new();
    let headers = headers.unwrap_or(&empty);
    let mut tests =
        binding
            .iter()
            .filter(|(k, _)| !k.starts_with("x-"))
            .map(|(k, v)| match headers.get(k) {
                None => false,
                Some(h) => matches!(v, AmqpValue::Void) || same_value(v, h),
            });
    if any {
        tests.any(|t| t)
    } else {
        tests.all(|t| t)
    }
}

impl State {
    /// The queues a message published to `exchange` with `key` goes to (each once). The caller
    /// has checked the exchange exists.
    pub(super) fn route(
        &self,
        exchange: &str,
        key: &str,
        headers: Option<&FieldTable>,
    ) -> Vec<String> {
        if exchange.is_empty() {
            return if self.queues.contains_key(key) {
                vec![key.to_string()]
            } else {
                Vec::new()
            };
        }
        let Some(x) = self.exchanges.get(exchange) else {
            return Vec::new();
        };
        let mut out: Vec<String> = Vec::new();
        for b in &x.bindings {
            let hit = match x.kind {
                Kind::Direct => b.key == key,
                Kind::Fanout => true,
                Kind::Topic => topic_matches(&b.key, key),
                Kind::Headers => headers_match(&b.arguments, headers),
            };
            if hit && !out.contains(&b.queue) && self.queues.contains_key(&b.queue) {
                out.push(b.queue.clone());
            }
        }
        out
    }

    pub(super) fn exchange_exists(&self, exchange: &str) -> bool {
        exchange.is_empty() || self.exchanges.contains_key(exchange)
    }

    /// An exchange may be published to: it exists and is not internal.
    pub(super) fn check_publish_exchange(&self, exchange: &str) -> Refused<()> {
        if exchange.is_empty() {
            return Ok(());
        }
        match self.exchanges.get(exchange) {
            None => Err(no_exchange(exchange)),
            Some(x) if x.internal => Err(access_refused(format!(
                "cannot publish to internal exchange '{exchange}' in vhost '/'"
            ))),
            Some(_) => Ok(()),
        }
    }

    pub(super) fn exchange_declare(
        &mut self,
        kind: &ExchangeType,
        name: &str,
        o: &ExchangeDeclareOptions,
    ) -> Refused<()> {
        if name.is_empty() {
            return Err(default_exchange());
        }
        let kind = kind_of(kind)?;
        for key in o.arguments.keys() {
            if key == "alternate-exchange" {
                return Err(not_emulated("the exchange argument 'alternate-exchange'"));
            }
            if key.starts_with("x-") {
                return Err(not_emulated(&format!("the exchange argument '{key}'")));
            }
        }
        let what = format!("exchange '{name}'");
        match self.exchanges.get(name) {
            Some(x) => {
                if x.kind != kind {
                    return Err(inequivalent(
                        "type",
                        &what,
                        &format!("'{}'", kind.name()),
                        &format!("'{}'", x.kind.name()),
                    ));
                }
                for (arg, now, was) in [
                    ("durable", o.durable, x.durable),
                    ("auto_delete", o.auto_delete, x.auto_delete),
                    ("internal", o.internal, x.internal),
                ] {
                    if now != was {
                        return Err(inequivalent(arg, &what, &flag(now), &flag(was)));
                    }
                }
                Ok(())
            }
            None if name.starts_with("amq.") => Err(access_refused(format!(
                "exchange name '{name}' contains reserved prefix 'amq.*'"
            ))),
            None => {
                let x = Exchange {
                    kind,
                    durable: o.durable,
                    auto_delete: o.auto_delete,
                    internal: o.internal,
                    bound: false,
                    bindings: Vec::new(),
                };
                self.exchanges.insert(name.to_string(), x);
                Ok(())
            }
        }
    }

    pub(super) fn exchange_passive(&self, name: &str) -> Refused<()> {
        if self.exchange_exists(name) {
            Ok(())
        } else {
            Err(no_exchange(name))
        }
    }

    pub(super) fn exchange_delete(&mut self, name: &str, if_unused: bool) -> Refused<()> {
        if name.is_empty() {
            return Err(default_exchange());
        }
        if name.starts_with("amq.") && self.exchanges.contains_key(name) {
            return Err(access_refused(format!(
                "deletion of system exchange '{name}' in vhost '/' not allowed"
            )));
        }
        match self.exchanges.get(name) {
            None => Ok(()),
            Some(x) if if_unused && !x.bindings.is_empty() => Err(precondition(format!(
                "exchange '{name}' in vhost '/' in use"
            ))),
            Some(_) => {
                self.exchanges.remove(name);
                Ok(())
            }
        }
    }

    /// The checks bind and unbind share: the default exchange refused, both ends exist, the
    /// queue is not another connection's exclusive queue.
    fn binding_ends(&self, conn: u64, queue: &str, exchange: &str) -> Refused<()> {
        if exchange.is_empty() {
            return Err(default_exchange());
        }
        if !self.exchanges.contains_key(exchange) {
            return Err(no_exchange(exchange));
        }
        match self.queues.get(queue) {
            None => Err(no_queue(queue)),
            Some(q) => q.check_owner(conn, queue),
        }
    }

    pub(super) fn queue_bind(
        &mut self,
        conn: u64,
        queue: &str,
        exchange: &str,
        key: &str,
        arguments: FieldTable,
    ) -> Refused<()> {
        self.binding_ends(conn, queue, exchange)?;
        let Some(x) = self.exchanges.get_mut(exchange) else {
            return Err(no_exchange(exchange));
        };
        if x.kind == Kind::Headers {
            match arguments.get("x-match") {
                None => {}
                Some(AmqpValue::LongString(s)) if s == "all" || s == "any" => {}
                Some(AmqpValue::LongString(s)) if s == "all-with-x" || s == "any-with-x" => {
                    return Err(not_emulated(&format!("x-match '{s}'")))
                }
                Some(v) => {
                    return Err(precondition(format!(
                        "Invalid x-match field value {v:?}; expected all, any, all-with-x, or \
                         any-with-x"
                    )))
                }
            }
        }
        let exists = x
            .bindings
            .iter()
            .any(|b| b.queue == queue && b.key == key && b.arguments == arguments);
        x.bound = true;
        if !exists {
            x.bindings.push(Binding {
                queue: queue.to_string(),
                key: key.to_string(),
                arguments,
            });
        }
        Ok(())
    }

    pub(super) fn queue_unbind(
        &mut self,
        conn: u64,
        queue: &str,
        exchange: &str,
        key: &str,
        arguments: &FieldTable,
    ) -> Refused<()> {
        self.binding_ends(conn, queue, exchange)?;
        let Some(x) = self.exchanges.get_mut(exchange) else {
            return Err(no_exchange(exchange));
        };
        x.bindings
            .retain(|b| !(b.queue == queue && b.key == key && &b.arguments == arguments));
        self.auto_delete_exchanges();
        Ok(())
    }

    /// Removes every binding to `queue` (it is being deleted).
    pub(super) fn unbind_queue(&mut self, queue: &str) {
        for x in self.exchanges.values_mut() {
            x.bindings.retain(|b| b.queue != queue);
        }
        self.auto_delete_exchanges();
    }

    /// Auto-delete exchanges go when their last binding goes (they had one by then).
    fn auto_delete_exchanges(&mut self) {
        self.exchanges
            .retain(|_, x| !(x.auto_delete && x.bound && x.bindings.is_empty()));
    }
}

#[cfg(test)]
mod topic_tests {
    use super::topic_matches;

    #[test]
    fn topic_patterns_match_as_rabbitmq_does() {
        assert!(topic_matches("a.*.c", "a.b.c"));
        assert!(!topic_matches("a.*.c", "a.c"));
        assert!(topic_matches("a.#", "a"));
        assert!(topic_matches("a.#", "a.b.c"));
        assert!(topic_matches("#", ""));
        assert!(topic_matches("#.c", "a.b.c"));
        assert!(!topic_matches("a.*", "a.b.c"));
        assert!(topic_matches("*.b.#", "a.b"));
    }
}
