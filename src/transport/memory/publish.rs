//! Publishing: the exchange checked (a refusal closes the channel after the call returned, as
//! RabbitMQ's asynchronous one does), the `expiration` property checked, routing, a `Return`
//! (312 NO_ROUTE) for an unroutable mandatory message before its confirm, the confirm itself
//! (ack, or nack under a fault or `x-overflow reject-publish`); a memory alarm holds publishes
//! in order until it ends.

use super::reply::{precondition, Refused};
use super::state::{End, Msg, Outgoing, State};
use crate::transport::{AmqpError, AmqpProperties, Confirm, ConfirmPayload, Publish, Return};

/// RabbitMQ's `parse_expiration`: an integer of ms, not negative, nothing after it.
fn expiration(p: &AmqpProperties) -> Refused<Option<u64>> {
    let Some(e) = p.expiration() else {
        return Ok(None);
    };
    let digits = e.trim_start_matches(['-', '+']);
    let sign = e.len() - digits.len();
    let end = digits
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(digits.len());
    let fail = |why: String| Err(precondition(format!("invalid expiration '{e}': {why}")));
    if end == 0 || sign > 1 {
        return fail("no_integer".into());
    }
    if end < digits.len() {
        return fail(format!("{{leftover_string,\"{}\"}}", &digits[end..]));
    }
    let n: i128 = e[..sign + end].parse().unwrap_or(i128::MAX);
    if n < 0 {
        return fail(format!("{{value_negative,{n}}}"));
    }
    Ok(Some(u64::try_from(n).unwrap_or(u64::MAX)))
}

impl State {
    /// `basic.publish`: Ok once handed over; a refusal closes the channel meanwhile.
    pub(super) fn publish(
        &mut self,
        conn: u64,
        chan: u16,
        exchange: &str,
        p: Publish<'_>,
    ) -> Result<(), AmqpError> {
        let ch = self.chan(conn, chan)?;
        let seq = ch.confirms.then(|| {
            ch.publish_seq += 1;
            ch.publish_seq
        });
        let out = Outgoing {
            exchange: exchange.to_string(),
            routing_key: p.routing_key,
            body: p.body.to_vec(),
            properties: p.properties,
            mandatory: p.mandatory,
        };
        if self.blocked.is_some() {
            if let Some(c) = self.conns.get_mut(&conn) {
                c.held.push_back((chan, seq, out));
            }
            return Ok(());
        }
        self.route_publish(conn, chan, seq, out);
        Ok(())
    }

    /// Routes a publish handed over on an open channel (now, or when an alarm ends).
    pub(super) fn route_publish(&mut self, conn: u64, chan: u16, seq: Option<u64>, out: Outgoing) {
        if self.check(conn, chan).is_err() {
            return;
        }
        let checked = self
            .check_publish_exchange(&out.exchange)
            .and_then(|()| expiration(&out.properties));
        let ms = match checked {
            Ok(ms) => ms,
            Err(r) => {
                self.close_channel(conn, chan, End::Server(r));
                return;
            }
        };
        if self.nack_next > 0 {
            self.nack_next -= 1;
            self.confirm(conn, chan, seq, false);
            return;
        }
        let targets = self.route(
            &out.exchange,
            &out.routing_key,
            out.properties.headers().as_ref(),
        );
        if targets.is_empty() && out.mandatory {
            let ret = Return {
                reply_code: 312,
                reply_text: "NO_ROUTE".into(),
                exchange: out.exchange.clone(),
                routing_key: out.routing_key.clone(),
                properties: out.properties.clone(),
            };
            if let Ok(ch) = self.chan(conn, chan) {
                if let Some(tx) = &ch.return_tx {
                    let _ = tx.send(ret);
                }
            }
        }
        let msg = Msg {
            seq: self.next_seq(),
            exchange: out.exchange,
            routing_key: out.routing_key,
            body: out.body,
            properties: out.properties,
            redelivered: false,
            expiration: ms,
            deadline: None,
            returns: 0,
            deaths: None,
        };
        let mut accepted = true;
        for target in targets {
            accepted &= self.enqueue(&target, msg.clone());
        }
        self.confirm(conn, chan, seq, accepted);
    }

    fn confirm(&mut self, conn: u64, chan: u16, seq: Option<u64>, ack: bool) {
        let Some(delivery_tag) = seq else {
            return;
        };
        let Ok(ch) = self.chan(conn, chan) else {
            return;
        };
        let payload = ConfirmPayload {
            delivery_tag,
            multiple: false,
        };
        if let Some(tx) = &ch.confirm_tx {
            let _ = tx.send(if ack {
                Confirm::Ack(payload)
            } else {
                Confirm::Nack(payload)
            });
        }
    }

    /// An alarm's end: every connection's held publishes, in order.
    pub(super) fn release_held(&mut self) {
        let mut conns: Vec<u64> = self.conns.keys().copied().collect();
        conns.sort_unstable();
        for conn in conns {
            let held = match self.conns.get_mut(&conn) {
                Some(c) => std::mem::take(&mut c.held),
                None => continue,
            };
            for (chan, seq, out) in held {
                self.route_publish(conn, chan, seq, out);
            }
        }
    }
}
